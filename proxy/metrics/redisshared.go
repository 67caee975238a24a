// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
)

// RedisShared watches how the Redis store spreads its buckets (budget.SharedRecorder):
// the releases of slot groups on a cluster and the leased slices of hot shared
// budgets (docs/redis.md, "Watching it").
type RedisShared struct {
	// Releases is tokenwarden_redis_slot_group_releases_total{result}: the slot groups
	// of a reservation released after a later group refused it, returned or lost (the
	// release call failed: the budget stays charged until it refills).
	Releases *prometheus.CounterVec
	// Slices is tokenwarden_redis_slices_total{dimension,budget,event}: slices of hot
	// shared budgets leased from Redis and returned to it.
	Slices *prometheus.CounterVec
	// SliceRefusals is tokenwarden_redis_slice_refusals_total{dimension,budget}: slices
	// the shared bucket could not give whole.
	SliceRefusals *prometheus.CounterVec
	// SliceHeld is tokenwarden_redis_slice_held_tokens{dimension,budget}: the tokens
	// this replica holds unspent in slices now.
	SliceHeld *prometheus.GaugeVec

	returned, lost prometheus.Counter
	// By dimension and period, for the leased dimensions (global, model) and periods
	// (minute, day); the others resolve their series on use.
	leased, given, refused [budget.NumDimensions][budget.NumKinds]prometheus.Counter
	held                   [budget.NumDimensions][budget.NumKinds]prometheus.Gauge
}

func newRedisShared(reg prometheus.Registerer) *RedisShared {
	dk := []string{"dimension", "budget"}
	r := &RedisShared{
		Releases: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tokenwarden_redis_slot_group_releases_total",
			Help: "Reservations on a Redis Cluster whose slot groups already taken were released because a later group refused (or failed), by result: returned, or lost (the release call failed and the budget stays charged, by at most the reservation, until it refills).",
		}, []string{"result"}),
		Slices: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tokenwarden_redis_slices_total",
			Help: "Slices of hot shared budgets (hot_budget_slice) this replica leased from Redis and returned to it (idle, reloaded or closing), by dimension, budget period and event (leased, returned).",
		}, []string{"dimension", "budget", "event"}),
		SliceRefusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tokenwarden_redis_slice_refusals_total",
			Help: "Slices of hot shared budgets the shared bucket could not give whole, by dimension and budget period: the request was decided in Redis without a slice.",
		}, dk),
		SliceHeld: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "tokenwarden_redis_slice_held_tokens",
			Help: "Tokens of hot shared budgets this replica holds unspent in leased slices now, by dimension and budget period: missing from the shared bucket until spent or returned.",
		}, dk),
	}
	reg.MustRegister(r.Releases, r.Slices, r.SliceRefusals, r.SliceHeld)
	r.returned = r.Releases.WithLabelValues("returned")
	r.lost = r.Releases.WithLabelValues("lost")
	for _, d := range []budget.Dimension{budget.Global, budget.Model} {
		for _, k := range []budget.Kind{budget.TokensMinute, budget.TokensDay} {
			ds, ks := d.String(), k.String()
			r.leased[d][k] = r.Slices.WithLabelValues(ds, ks, "leased")
			r.given[d][k] = r.Slices.WithLabelValues(ds, ks, "returned")
			r.refused[d][k] = r.SliceRefusals.WithLabelValues(ds, ks)
			r.held[d][k] = r.SliceHeld.WithLabelValues(ds, ks)
		}
	}
	return r
}

// SlotGroupRelease implements budget.SharedRecorder.
func (m *Metrics) SlotGroupRelease(lost bool) {
	if lost {
		m.RedisShared.lost.Inc()
	} else {
		m.RedisShared.returned.Inc()
	}
}

// SliceLeased implements budget.SharedRecorder.
func (m *Metrics) SliceLeased(d budget.Dimension, k budget.Kind) {
	m.RedisShared.counter(&m.RedisShared.leased, m.RedisShared.Slices, d, k, "leased").Inc()
}

// SliceReturned implements budget.SharedRecorder.
func (m *Metrics) SliceReturned(d budget.Dimension, k budget.Kind) {
	m.RedisShared.counter(&m.RedisShared.given, m.RedisShared.Slices, d, k, "returned").Inc()
}

// SliceRefused implements budget.SharedRecorder.
func (m *Metrics) SliceRefused(d budget.Dimension, k budget.Kind) {
	m.RedisShared.counter(&m.RedisShared.refused, m.RedisShared.SliceRefusals, d, k, "").Inc()
}

// SliceHeld implements budget.SharedRecorder.
func (m *Metrics) SliceHeld(d budget.Dimension, k budget.Kind, delta float64) {
	r := m.RedisShared
	if d < budget.NumDimensions && k < budget.NumKinds && r.held[d][k] != nil {
		r.held[d][k].Add(delta)
		return
	}
	r.SliceHeld.WithLabelValues(d.String(), k.String()).Add(delta)
}

// counter is the pre-resolved child of d and k, or the family's (with event, when
// set) for a dimension or period not resolved ahead.
func (r *RedisShared) counter(set *[budget.NumDimensions][budget.NumKinds]prometheus.Counter, vec *prometheus.CounterVec,
	d budget.Dimension, k budget.Kind, event string) prometheus.Counter {
	if d < budget.NumDimensions && k < budget.NumKinds && set[d][k] != nil {
		return set[d][k]
	}
	if event != "" {
		return vec.WithLabelValues(d.String(), k.String(), event)
	}
	return vec.WithLabelValues(d.String(), k.String())
}

var _ budget.SharedRecorder = (*Metrics)(nil)
