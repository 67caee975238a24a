// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package ledger_test

import (
	"context"
	"encoding/json"
	"path/filepath"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tokenwarden/tokenwarden/proxy/ledger"
	"github.com/tokenwarden/tokenwarden/proxy/ledger/ledgerstate"
	"github.com/tokenwarden/tokenwarden/proxy/ledger/ledgertest"
)

var _ = Describe("the ledger's metrics and state", func() {
	It("shows a spool while the database is down, full and what it dropped, and the moment everything is in after it is back", func() {
		ctx := context.Background()
		sink, err := ledger.Open(ctx, "sqlite:"+filepath.Join(GinkgoT().TempDir(), "ledger.db"))
		Expect(err).NotTo(HaveOccurred())
		defer sink.Close()
		o := &ledgertest.Outage{Sink: sink}
		now := time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)
		clock := func() time.Time { return now }
		l, err := ledger.New(ledger.Config{Sink: o, Pod: "proxy-0", FlushInterval: -1, SpoolBytes: 8 << 10, Now: clock})
		Expect(err).NotTo(HaveOccurred())
		reg := prometheus.NewPedanticRegistry()
		reg.MustRegister(ledger.NewCollector(l, clock))
		gauge := func(name string) float64 {
			mfs, err := reg.Gather()
			Expect(err).NotTo(HaveOccurred())
			for _, mf := range mfs {
				if mf.GetName() == name {
					return mf.GetMetric()[0].GetGauge().GetValue()
				}
			}
			Fail("no " + name)
			return 0
		}

		Expect(l.State()).To(Equal(ledgerstate.State{}))
		o.Down.Store(true)
		ledgertest.AddConcurrently(l, 1, 5)
		Expect(l.Flush(ctx)).To(HaveOccurred())
		now = now.Add(90 * time.Second)
		Expect(gauge("tokenwarden_ledger_spool_batches")).To(Equal(1.0))
		Expect(gauge("tokenwarden_ledger_spool_oldest_age_seconds")).To(Equal(90.0))
		Expect(gauge("tokenwarden_ledger_spool_full")).To(Equal(0.0))
		st := l.State()
		Expect(st.Spooling).To(BeTrue())
		Expect(st.Oldest).To(HaveValue(BeTemporally("==", now.Add(-90*time.Second))))

		By("the spool full: a batch dropped, its requests counted")
		for range 30 {
			ledgertest.AddConcurrently(l, 2, 40)
			_ = l.Flush(ctx)
		}
		Expect(gauge("tokenwarden_ledger_spool_full")).To(Equal(1.0))
		Expect(l.State().Full).To(BeTrue())
		dropped := l.Stats().Dropped
		Expect(dropped.Batches).To(BeNumerically(">", 0))
		Expect(counterValue(reg, "tokenwarden_ledger_unrecorded_requests_total", "dropped")).To(Equal(float64(dropped.Requests)))

		By("the database back: the spool drained and everything before the flush in")
		o.Down.Store(false)
		Expect(l.Flush(ctx)).To(Succeed())
		Expect(gauge("tokenwarden_ledger_spool_batches")).To(Equal(0.0))
		Expect(gauge("tokenwarden_ledger_spool_oldest_age_seconds")).To(Equal(0.0))
		Expect(gauge("tokenwarden_ledger_flushed_through_timestamp_seconds")).To(Equal(float64(now.Unix())))
		var back ledgerstate.State
		Expect(json.Unmarshal([]byte(l.State().Encode()), &back)).To(Succeed())
		Expect(back.Spooling || back.Full).To(BeFalse())
		Expect(back.FlushedThrough).To(HaveValue(BeTemporally("==", now)))
		Expect(back.DroppedBatches).To(Equal(dropped.Batches))
		Expect(testutil.CollectAndLint(ledger.NewCollector(l, clock))).To(BeEmpty())
	})
})

// counterValue is the value of a family's counter with one label value.
func counterValue(reg *prometheus.Registry, name, label string) float64 {
	mfs, err := reg.Gather()
	Expect(err).NotTo(HaveOccurred())
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			if mf.GetName() == name && len(m.GetLabel()) == 1 && m.GetLabel()[0].GetValue() == label {
				return m.GetCounter().GetValue()
			}
		}
	}
	Fail("no " + name + " " + label)
	return 0
}
