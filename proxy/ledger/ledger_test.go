// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package ledger_test

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/tokenwarden/tokenwarden/proxy/ledger"
	"github.com/tokenwarden/tokenwarden/proxy/ledger/ledgertest"
	"github.com/tokenwarden/tokenwarden/test/pgserver"
)

func TestLedger(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "Ledger Suite")
}

// pg is the suite's PostgreSQL, started once: each spec gets a database of its own.
var pg *pgserver.Server

var _ = BeforeSuite(func() {
	pg = pgserver.Start(GinkgoT())
})

var _ = ledgertest.DescribeSink("PostgreSQL", ledgertest.Backend{
	NewURL: func() string { return pg.NewDatabase(GinkgoT()) },
})

var _ = ledgertest.DescribeSink("SQLite", ledgertest.Backend{
	NewURL: func() string { return "sqlite:" + filepath.Join(GinkgoT().TempDir(), "ledger.db") },
})

var _ = Describe("the ledger on PostgreSQL", func() {
	var ctx context.Context
	BeforeEach(func() { ctx = context.Background() })

	It("loses nothing and doubles nothing when the database is killed under load and comes back", func() {
		url := pg.NewDatabase(GinkgoT())
		sink, err := ledger.Open(ctx, url)
		Expect(err).NotTo(HaveOccurred())
		defer sink.Close()
		l, err := ledger.New(ledger.Config{Sink: sink, Pod: "proxy-0", SpoolDir: GinkgoT().TempDir(), FlushInterval: 20 * time.Millisecond,
			Logger: slog.New(slog.NewTextHandler(GinkgoWriter, nil))})
		Expect(err).NotTo(HaveOccurred())

		var (
			stop    atomic.Bool
			wg      sync.WaitGroup
			mu      sync.Mutex
			records []ledger.Record
		)
		for w := range 4 {
			wg.Go(func() {
				for i := 0; !stop.Load(); i++ {
					r := ledgertest.Settlement(w, i)
					l.Add(r)
					mu.Lock()
					records = append(records, r)
					mu.Unlock()
					if i%50 == 0 {
						time.Sleep(time.Millisecond) // settlements arrive over time, not in one burst
					}
				}
			})
		}
		// Flushes land, then the database dies at once, mid-flush, twice.
		for range 2 {
			Eventually(func() int64 { return l.Stats().Flushed }).WithTimeout(30 * time.Second).Should(BeNumerically(">=", 3))
			Expect(pg.Stop("immediate")).To(Succeed())
			Eventually(func() int { return l.Stats().SpoolBatches }).WithTimeout(30 * time.Second).Should(BeNumerically(">=", 3))
			Expect(l.Stats().LastError).To(HaveOccurred())
			Expect(pg.Start()).To(Succeed())
			Eventually(func() int { return l.Stats().SpoolBatches }).WithTimeout(30*time.Second).Should(BeNumerically("<", 2), "the spool replays once the database is back")
		}
		stop.Store(true)
		wg.Wait()
		Expect(l.Close(ctx)).To(Succeed())
		st := l.Stats()
		Expect(st.Dropped).To(Equal(ledger.Dropped{}))
		Expect(st.SpoolBatches).To(Equal(0))
		GinkgoWriter.Printf("%d settlements, %d batches applied, %d sent again and counted once\n", len(records), st.Flushed, st.Duplicates)
		Expect(ledgertest.ReportTotal(ctx, sink)).To(Equal(ledgertest.Total(records)))
	})

	It("migrates once when many replicas start on an empty database at once", func() {
		url := pg.NewDatabase(GinkgoT())
		var wg sync.WaitGroup
		errs := make([]error, 6)
		for i := range errs {
			wg.Go(func() {
				s, err := ledger.Open(ctx, url)
				if err == nil {
					err = s.Close()
				}
				errs[i] = err
			})
		}
		wg.Wait()
		for i, err := range errs {
			Expect(err).NotTo(HaveOccurred(), fmt.Sprintf("replica %d", i))
		}
		s, err := ledger.Open(ctx, url)
		Expect(err).NotTo(HaveOccurred())
		defer s.Close()
		Expect(s.Version(ctx)).To(Equal(int64(ledger.SchemaVersion)))
		var applied int
		Expect(s.DB().QueryRowContext(ctx, "SELECT count(*) FROM ledger_schema_version WHERE version_id > 0").Scan(&applied)).To(Succeed())
		Expect(applied).To(Equal(ledger.SchemaVersion), "each migration applied once")
	})
})
