// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package cache

import (
	"context"
	"sync/atomic"
	"time"
)

// Clock is the injected clock the stores read an entry's age on.
type Clock interface{ Now() time.Time }

// Store keeps entries for a time to live. A store's failure is a miss, never an
// error the request sees: Get reports only whether it found a fresh entry, Put keeps
// what it can.
type Store interface {
	// Get is the fresh entry under k, if any.
	Get(ctx context.Context, k Key) (*Entry, bool)
	// Put stores e under k for the store's time to live (its body is shared, never
	// written). It stores even when ctx was cancelled: an answer stored as its client
	// leaves is still whole.
	Put(ctx context.Context, k Key, e Entry)
	// Purge drops the entries that match and reports how many it dropped.
	Purge(ctx context.Context, m Match) (int, error)
	// Stats is what the store holds and has done.
	Stats() Stats
}

// Match selects entries to purge: those of a scope, of a model, or both when both are
// set. An empty Match matches every entry.
type Match struct {
	Scope string
	Model string
}

func (m Match) matches(k Key) bool {
	return (m.Scope == "" || m.Scope == k.Scope) && (m.Model == "" || m.Model == k.Model)
}

// Stats are a store's gauges and counters.
type Stats struct {
	// Entries and Bytes are what the store holds (the memory store's; the Redis
	// store's are Redis' own and read as 0).
	Entries, Bytes int64
	// Evictions counts entries dropped to make room, Expired those found past their
	// time to live, Errors the calls to the store that failed (each a miss).
	Evictions, Expired, Errors int64
}

// counters are the Stats counters, shared by both stores.
type counters struct{ evictions, expired, errors atomic.Int64 }

func (c *counters) stats() Stats {
	return Stats{Evictions: c.evictions.Load(), Expired: c.expired.Load(), Errors: c.errors.Load()}
}
