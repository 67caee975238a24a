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
	// DroppedBatches and ExpiredBatches count what was not recorded.
	DroppedBatches int64 `json:"dropped_batches,omitempty"`
	ExpiredBatches int64 `json:"expired_batches,omitempty"`
}

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
