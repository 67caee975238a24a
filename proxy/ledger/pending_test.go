// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package ledger_test

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/tokenwarden/tokenwarden/proxy/ledger"
	"github.com/tokenwarden/tokenwarden/proxy/ledger/ledgertest"
)

// pendingRace adds settlements, flushes and reads Pending at once, for a while, and
// checks every read: run brackets each Pending with what was added before it began
// and what was being added when it ended, and with what the sink held after (when sink is set).
type pendingRace struct {
	ctx  context.Context
	l    *ledger.Ledger
	sink ledger.Sink
	// adding and added are the micro-dollars of the settlements whose Add has
	// begun, and ended.
	adding, added atomic.Int64
	flushes       atomic.Int64
}

// pendingCost is one read: Pending's micro-dollars, bracketed.
type pendingCost struct {
	addedBefore, addedAfter int64
	sinkAfter               int64
	pending                 int64
}

func (p *pendingRace) cost(rows []ledger.ReportRow, err error) int64 {
	ExpectWithOffset(1, err).NotTo(HaveOccurred())
	var n int64
	for _, r := range rows {
		n += r.CostMicros
	}
	return n
}

// run races writers, a flusher and a reader for d (longer until 300 flushes ran),
// and returns the reads.
func (p *pendingRace) run(d time.Duration) []pendingCost {
	var (
		stop  atomic.Bool
		wg    sync.WaitGroup
		reads []pendingCost
	)
	for w := range 2 {
		wg.Go(func() {
			for i := 0; !stop.Load(); i++ {
				r := ledgertest.Settlement(w, i)
				p.adding.Add(r.CostMicros)
				p.l.Add(r)
				p.added.Add(r.CostMicros)
				time.Sleep(20 * time.Microsecond)
			}
		})
	}
	wg.Go(func() {
		for !stop.Load() {
			_ = p.l.Flush(p.ctx) // the sink may be down: the batches wait in the spool
			p.flushes.Add(1)
			time.Sleep(100 * time.Microsecond)
		}
	})
	wg.Go(func() {
		defer GinkgoRecover()
		for !stop.Load() {
			var c pendingCost
			c.addedBefore = p.added.Load()
			c.pending = p.cost(p.l.Pending(p.ctx, ledgertest.All()))
			c.addedAfter = p.adding.Load()
			if p.sink != nil {
				c.sinkAfter = p.cost(p.sink.Report(p.ctx, ledgertest.All()))
			}
			reads = append(reads, c)
		}
	})
	// At least d, and on a loaded host until enough flushes raced the reads.
	time.Sleep(d)
	for end := time.Now().Add(5 * d); time.Now().Before(end) && p.flushes.Load() < 300; {
		time.Sleep(10 * time.Millisecond)
	}
	stop.Store(true)
	wg.Wait()
	return reads
}

var _ = Describe("Pending while a flush moves the batches", func() {
	var (
		ctx    context.Context
		outage *ledgertest.Outage
	)
	// start makes the race on a ledger of cfg, whose sink is outage.
	start := func(cfg ledger.Config) *pendingRace {
		cfg.Sink, cfg.Pod, cfg.FlushInterval = outage, "proxy-0", -1
		cfg.Logger = slog.New(slog.NewTextHandler(GinkgoWriter, &slog.HandlerOptions{Level: slog.LevelError}))
		l, err := ledger.New(cfg)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { _ = l.Close(ctx) })
		return &pendingRace{ctx: ctx, l: l, sink: outage.Sink}
	}
	BeforeEach(func() {
		ctx = context.Background()
		sink, err := ledger.Open(ctx, pg.NewDatabase(GinkgoT()))
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(sink.Close)
		outage = &ledgertest.Outage{Sink: sink}
	})

	It("counts each dollar once while the database is down and every batch goes to the spool", func() {
		outage.Down.Store(true)
		race := start(ledger.Config{})
		race.sink = nil // it holds nothing
		reads := race.run(3 * time.Second)
		Expect(len(reads)).To(BeNumerically(">", 1000), "reads raced the flushes")
		Expect(race.l.Stats().SpoolBatches).To(BeNumerically(">=", 100), "flushes moved batches into the spool")
		expectExact(reads)
	})

	It("counts each dollar once while the spool is full and a flush puts its batch back in memory", func() {
		outage.Down.Store(true)
		race := start(ledger.Config{SpoolBytes: 1, WhenFull: ledger.Refuse})
		race.sink = nil
		reads := race.run(3 * time.Second)
		Expect(len(reads)).To(BeNumerically(">", 1000), "reads raced the flushes")
		Expect(race.l.Refusing()).To(BeTrue(), "the spool is full, and the batches go back to memory")
		Expect(race.l.Stats().Dropped).To(Equal(ledger.Dropped{}))
		expectExact(reads)
	})

	It("misses nothing and doubles nothing while the database takes the batches", func() {
		race := start(ledger.Config{})
		reads := race.run(3 * time.Second)
		Expect(len(reads)).To(BeNumerically(">", 20), "reads raced the flushes")
		Expect(race.l.Stats().Flushed).To(BeNumerically(">=", 20), "flushes moved batches into the database")
		for i, c := range reads {
			// Read before the sink's sum, Pending and the sum miss nothing added before
			// it (a batch the database took while the spool still held it may count in
			// both, as documented), and Pending alone holds no dollar twice.
			Expect(c.pending+c.sinkAfter).To(BeNumerically(">=", c.addedBefore), "read %d: a dollar missing", i)
			Expect(c.pending).To(BeNumerically("<=", c.addedAfter), "read %d: a dollar counted twice", i)
		}
	})
})

// expectExact checks reads of a ledger whose sink takes nothing: each Pending is
// exactly what was added, as of some moment during the read.
func expectExact(reads []pendingCost) {
	for i, c := range reads {
		ExpectWithOffset(1, c.pending).To(BeNumerically(">=", c.addedBefore), "read %d: a dollar missing", i)
		ExpectWithOffset(1, c.pending).To(BeNumerically("<=", c.addedAfter), "read %d: a dollar counted twice", i)
	}
}
