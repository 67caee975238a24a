// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package metrics

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// Cache results (the result label and the X-Tokenwarden-Cache header's values).
const (
	CacheHit       = "hit"
	CacheMiss      = "miss"
	CacheCoalesced = "coalesced"
	CacheBypass    = "bypass"
)

// CacheStats are what the response cache's store holds and has done.
type CacheStats struct {
	Entries, Bytes, Evictions, Errors int64
}

// Cache is the response cache's families (docs/cache.md).
type Cache struct {
	// Requests is tokenwarden_cache_requests_total{model,result}: hit, miss,
	// coalesced (a waiter served by a request in flight) or bypass.
	Requests *prometheus.CounterVec
	// SavedTokens is tokenwarden_cache_saved_tokens_total{model,type}: the input and
	// output tokens of the stored or leading answers that hits and waiters replayed.
	SavedTokens *prometheus.CounterVec
	// SavedDollars is tokenwarden_cache_saved_dollars_total{model}: those tokens priced.
	SavedDollars *prometheus.CounterVec
	// NotStored is tokenwarden_cache_not_stored_total{reason}: answers that were not
	// stored, by reason (status, cut, unreadable, too_large, no_store, encoded).
	NotStored *prometheus.CounterVec
	source    atomic.Pointer[func() CacheStats]
}

func newCache(reg prometheus.Registerer) *Cache {
	c := &Cache{
		Requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tokenwarden_cache_requests_total",
			Help: "Requests the response cache saw, by model and result: hit, miss, coalesced or bypass.",
		}, []string{"model", "result"}),
		SavedTokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tokenwarden_cache_saved_tokens_total",
			Help: "Tokens of the answers that cache hits and coalesced waiters replayed without a backend call, by model and type.",
		}, []string{"model", "type"}),
		SavedDollars: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tokenwarden_cache_saved_dollars_total",
			Help: "Dollars the replayed answers' tokens cost at the model's price, by model.",
		}, []string{"model"}),
		NotStored: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tokenwarden_cache_not_stored_total",
			Help: "Answers the response cache did not store, by reason.",
		}, []string{"reason"}),
	}
	gauge := func(name, help string, read func(CacheStats) int64, counter bool) prometheus.Collector {
		f := func() float64 {
			if src := c.source.Load(); src != nil {
				return float64(read((*src)()))
			}
			return 0
		}
		if counter {
			return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help}, f)
		}
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, f)
	}
	reg.MustRegister(c.Requests, c.SavedTokens, c.SavedDollars, c.NotStored,
		gauge("tokenwarden_cache_entries", "Answers the replica's memory cache holds (0 for a Redis cache).", func(s CacheStats) int64 { return s.Entries }, false),
		gauge("tokenwarden_cache_bytes", "Bytes the replica's memory cache holds (0 for a Redis cache).", func(s CacheStats) int64 { return s.Bytes }, false),
		gauge("tokenwarden_cache_evictions_total", "Answers the memory cache dropped to stay within its bytes.", func(s CacheStats) int64 { return s.Evictions }, true),
		gauge("tokenwarden_cache_errors_total", "Calls to the cache's store that failed, each read as a miss.", func(s CacheStats) int64 { return s.Errors }, true),
	)
	return c
}

// SetSource sets what the store gauges read; nil reads zero.
func (c *Cache) SetSource(f func() CacheStats) {
	if f == nil {
		c.source.Store(nil)
		return
	}
	c.source.Store(&f)
}

// Saved counts an answer replayed without a backend call.
func (c *Cache) Saved(model string, input, output int64, dollars float64, priced bool) {
	c.SavedTokens.WithLabelValues(model, "input").Add(float64(input))
	c.SavedTokens.WithLabelValues(model, "output").Add(float64(output))
	if priced {
		c.SavedDollars.WithLabelValues(model).Add(dollars)
	}
}
