// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

// Package ledgerstate is what a replica reports of its spend ledger to the control
// plane, in its report Lease's tokenwarden.io/ledger annotation. It has no
// dependencies, so that the operator and the kubectl plugin read the annotation with
// the proxy's own type and without the ledger's database drivers.
package ledgerstate

import (
	"encoding/json"
	"time"
)

// State is a replica's ledger: whether settlements wait in the spool, and up to when
// everything is in the database.
type State struct {
	// Spooling: the last flush failed and batches wait in the spool.
	Spooling bool `json:"spooling,omitempty"`
	// Full: the spool is full; what does not fit is dropped and counted.
	Full         bool  `json:"full,omitempty"`
	SpoolBatches int   `json:"spool_batches"`
	SpoolBytes   int64 `json:"spool_bytes"`
	// Oldest is when the oldest spooled batch was made.
	Oldest *time.Time `json:"oldest,omitempty"`
	// FlushedThrough: every settlement added before it is in the database.
	FlushedThrough *time.Time `json:"flushed_through,omitempty"`
	// Dropped* sum what the ledger never recorded because the spool was full
	// (whenSpoolFull: KeepServing): batches, their rows (the rollup's records), the
	// requests they held and those requests' micro-dollars. Expired* sum the spooled
	// batches set aside unreplayed, older than the key retention allows. They count
	// since the replica's identity began, across restarts of its process.
	DroppedBatches    int64 `json:"dropped_batches,omitempty"`
	DroppedRows       int64 `json:"dropped_rows,omitempty"`
	DroppedRequests   int64 `json:"dropped_requests,omitempty"`
	DroppedCostMicros int64 `json:"dropped_cost_micro_usd,omitempty"`
	ExpiredBatches    int64 `json:"expired_batches,omitempty"`
	ExpiredRows       int64 `json:"expired_rows,omitempty"`
	ExpiredRequests   int64 `json:"expired_requests,omitempty"`
	ExpiredCostMicros int64 `json:"expired_cost_micro_usd,omitempty"`
}

// Unrecorded reports whether the ledger misses settlements: dropped or expired.
func (s *State) Unrecorded() bool { return s.DroppedRows+s.ExpiredRows > 0 }

// Encode is the state as the annotation holds it.
func (s State) Encode() string {
	b, _ := json.Marshal(s)
	return string(b)
}

// Parse reads an annotation's value; false when it is empty or does not parse.
func Parse(v string) (State, bool) {
	var s State
	if v == "" || json.Unmarshal([]byte(v), &s) != nil {
		return State{}, false
	}
	return s, true
}
