// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

// Package ledger is the durable record of every settlement, rolled up per minute, for audit and chargeback reports.
package ledger

import (
	"cmp"
	"time"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
)

// Dims are what a settlement is recorded by. APIKey is the key's name in the config,
// never its secret. An empty value is recorded as empty (a key without a team).
type Dims struct {
	Fleet    string `json:"fleet"`
	Tenant   string `json:"tenant"`
	APIKey   string `json:"api_key"`
	User     string `json:"user"`
	Team     string `json:"team"`
	Model    string `json:"model"`
	Upstream string `json:"upstream"`
}

// Record is one settled request.
type Record struct {
	// Time is when the request settled; it is recorded in its UTC minute.
	Time time.Time
	Dims
	// Used is the usage the request was settled on.
	Used budget.Used
	// CostMicros is what the budgets charged for it, in micro-dollars
	// (budget.Policy.CostMicros); 0 for a model without a price.
	CostMicros int64
	// CacheHit: the answer came from the response cache, cost nothing, and saved
	// Saved tokens and SavedMicros.
	CacheHit    bool
	Saved       budget.Used
	SavedMicros int64
}

// Sums are what a rollup adds up. Money is in integer micro-dollars.
type Sums struct {
	Requests     int64 `json:"requests"`
	InputTokens  int64 `json:"input_tokens"`
	OutputTokens int64 `json:"output_tokens"`
	CachedTokens int64 `json:"cached_tokens"`
	CostMicros   int64 `json:"cost_micro_usd"`
	CacheHits    int64 `json:"cache_hits"`
	SavedInput   int64 `json:"saved_input_tokens"`
	SavedOutput  int64 `json:"saved_output_tokens"`
	SavedMicros  int64 `json:"saved_micro_usd"`
}

// add adds another rollup's sums.
func (s *Sums) add(o *Sums) {
	s.Requests += o.Requests
	s.InputTokens += o.InputTokens
	s.OutputTokens += o.OutputTokens
	s.CachedTokens += o.CachedTokens
	s.CostMicros += o.CostMicros
	s.CacheHits += o.CacheHits
	s.SavedInput += o.SavedInput
	s.SavedOutput += o.SavedOutput
	s.SavedMicros += o.SavedMicros
}

// addRecord counts one settlement.
func (s *Sums) addRecord(r *Record) {
	s.Requests++
	s.InputTokens += r.Used.Input
	s.OutputTokens += r.Used.Output
	s.CachedTokens += r.Used.Cached
	s.CostMicros += r.CostMicros
	if r.CacheHit {
		s.CacheHits++
	}
	s.SavedInput += r.Saved.Input
	s.SavedOutput += r.Saved.Output
	s.SavedMicros += r.SavedMicros
}

// Row is one rollup: the sums of one minute's settlements with the same dims.
type Row struct {
	// Minute is the minute's start in Unix seconds (UTC).
	Minute int64 `json:"minute"`
	Dims
	Sums
}

// Batch is what one flush hands the sink: its rows, under the idempotency key
// (Replica, Seq) that makes a retry or a replay count once.
type Batch struct {
	Replica string `json:"replica"`
	Seq     int64  `json:"seq"`
	// Created is when the batch was made, in Unix seconds (0 in spool files written
	// before it was kept).
	Created int64 `json:"created,omitempty"`
	Rows    []Row `json:"rows"`
}

// totals are a batch's sums over all its rows.
func (b *Batch) totals() Sums {
	var s Sums
	for i := range b.Rows {
		s.add(&b.Rows[i].Sums)
	}
	return s
}

// compareRows orders rows by their key, the order a sink locks them in (two replicas
// writing the same rows never wait for each other in a cycle).
func compareRows(a, b *Row) int {
	return cmp.Or(cmp.Compare(a.Minute, b.Minute), cmp.Compare(a.Fleet, b.Fleet), cmp.Compare(a.Tenant, b.Tenant),
		cmp.Compare(a.APIKey, b.APIKey), cmp.Compare(a.User, b.User), cmp.Compare(a.Team, b.Team),
		cmp.Compare(a.Model, b.Model), cmp.Compare(a.Upstream, b.Upstream))
}
