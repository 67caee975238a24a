// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package ledger

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokenwarden/tokenwarden/proxy/ledger/ledgerstate"
)

// State is the ledger's state now.
func (l *Ledger) State() ledgerstate.State {
	st := l.Stats()
	s := ledgerstate.State{Spooling: st.LastError != nil && st.SpoolBatches > 0, Full: st.Full,
		SpoolBatches: st.SpoolBatches, SpoolBytes: st.SpoolBytes}
	s.DroppedBatches, s.DroppedRows, s.DroppedRequests, s.DroppedCostMicros = st.Dropped.Batches, st.Dropped.Rows, st.Dropped.Requests, st.Dropped.CostMicros
	s.ExpiredBatches, s.ExpiredRows, s.ExpiredRequests, s.ExpiredCostMicros = st.Expired.Batches, st.Expired.Rows, st.Expired.Requests, st.Expired.CostMicros
	if !st.Oldest.IsZero() {
		t := st.Oldest.UTC()
		s.Oldest = &t
	}
	if !st.FlushedThrough.IsZero() {
		t := st.FlushedThrough.UTC().Truncate(time.Second)
		s.FlushedThrough = &t
	}
	return s
}

// collector exports a ledger's counters, read at each scrape.
type collector struct {
	l   *Ledger
	now func() time.Time

	spoolBatches, spoolBytes, oldestAge, full, flushedThrough *prometheus.Desc
	batches, unrecordedRequests, unrecordedCost, pruned       *prometheus.Desc
	refused                                                   *prometheus.Desc
}

// NewCollector is the ledger's metrics (docs/ledger.md, "Metrics"); now is the clock
// of the spool's age (nil: time.Now).
func NewCollector(l *Ledger, now func() time.Time) prometheus.Collector {
	if now == nil {
		now = time.Now
	}
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc("tokenwarden_ledger_"+name, help, labels, nil)
	}
	return &collector{l: l, now: now,
		spoolBatches:       d("spool_batches", "Batches of settlements waiting in the spool for the ledger database."),
		spoolBytes:         d("spool_bytes", "Bytes the spooled batches take, of the spool's bound."),
		oldestAge:          d("spool_oldest_age_seconds", "Age of the oldest spooled batch; 0 when the spool is empty."),
		full:               d("spool_full", "1 while the spool is full and the database does not take a batch: what does not fit is not recorded."),
		flushedThrough:     d("flushed_through_timestamp_seconds", "Every settlement added before this Unix time is in the ledger database."),
		batches:            d("batches_total", "Batches by what became of them: flushed (applied), duplicate (applied before: a retry or replay counted once), dropped (no room in a full spool) or expired (spooled longer than the key retention allows a replay).", "result"),
		unrecordedRequests: d("unrecorded_requests_total", "Settled requests the ledger could not record, by reason (dropped or expired).", "reason"),
		unrecordedCost:     d("unrecorded_cost_micro_usd_total", "Micro-dollars of settled requests the ledger could not record, by reason (dropped or expired).", "reason"),
		pruned:             d("pruned_keys_total", "Idempotency keys this replica pruned from the database, older than the key retention."),
		refused:            d("refused_requests_total", "Requests that cost budgets govern refused while the spool was full (when_full: refuse)."),
	}
}

// Describe implements prometheus.Collector.
func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.spoolBatches, c.spoolBytes, c.oldestAge, c.full, c.flushedThrough,
		c.batches, c.unrecordedRequests, c.unrecordedCost, c.pruned, c.refused} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *collector) Collect(ch chan<- prometheus.Metric) {
	st := c.l.Stats()
	gauge := func(d *prometheus.Desc, v float64) { ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v) }
	counter := func(d *prometheus.Desc, v int64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	gauge(c.spoolBatches, float64(st.SpoolBatches))
	gauge(c.spoolBytes, float64(st.SpoolBytes))
	age := 0.0
	if !st.Oldest.IsZero() {
		age = max(0, c.now().Sub(st.Oldest).Seconds())
	}
	gauge(c.oldestAge, age)
	full := 0.0
	if st.Full {
		full = 1
	}
	gauge(c.full, full)
	through := 0.0
	if !st.FlushedThrough.IsZero() {
		through = float64(st.FlushedThrough.Unix())
	}
	gauge(c.flushedThrough, through)
	counter(c.batches, st.Flushed, "flushed")
	counter(c.batches, st.Duplicates, "duplicate")
	counter(c.batches, st.Dropped.Batches, "dropped")
	counter(c.batches, st.Expired.Batches, "expired")
	counter(c.unrecordedRequests, st.Dropped.Requests, "dropped")
	counter(c.unrecordedRequests, st.Expired.Requests, "expired")
	counter(c.unrecordedCost, st.Dropped.CostMicros, "dropped")
	counter(c.unrecordedCost, st.Expired.CostMicros, "expired")
	counter(c.pruned, st.Pruned)
	counter(c.refused, st.Refused)
}
