// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package ledger

import (
	"hash/maphash"
	"slices"
	"sync"
	"sync/atomic"
)

// rollupKey is one rollup row's identity: a minute and the dims.
type rollupKey struct {
	minute int64
	Dims
}

// shards is how many locks the in-memory rollups are split over, so concurrent
// settlements rarely wait for one another.
const shards = 16

// rollups are the settlements not yet flushed, summed per minute and dims. Adding
// takes one shard's lock for a map update; taking swaps each shard's map.
type rollups struct {
	seed  maphash.Seed
	shard [shards]rollupShard
	// rows counts the rows held, for the early flush at the bound.
	rows atomic.Int64
}

type rollupShard struct {
	mu sync.Mutex
	m  map[rollupKey]*Sums
	_  [40]byte // a shard's lock on its own cache line
}

func newRollups() *rollups {
	r := &rollups{seed: maphash.MakeSeed()}
	for i := range r.shard {
		r.shard[i].m = map[rollupKey]*Sums{}
	}
	return r
}

// shardOf is the shard that holds the rows of d's key and model.
func (r *rollups) shardOf(d *Dims) *rollupShard {
	var h maphash.Hash
	h.SetSeed(r.seed)
	h.WriteString(d.APIKey)
	h.WriteString(d.Model)
	return &r.shard[h.Sum64()%shards]
}

// add counts rec in its minute's row and returns how many rows are held.
func (r *rollups) add(rec *Record) int64 {
	k := rollupKey{minute: minuteOf(rec.Time), Dims: rec.Dims}
	sh := r.shardOf(&rec.Dims)
	sh.mu.Lock()
	s := sh.m[k]
	fresh := s == nil
	if fresh {
		s = &Sums{}
		sh.m[k] = s
	}
	s.addRecord(rec)
	sh.mu.Unlock()
	if fresh {
		return r.rows.Add(1)
	}
	return r.rows.Load()
}

// putBack adds rows taken before (a batch that could not be kept) to the rows held.
func (r *rollups) putBack(rows []Row) {
	for i := range rows {
		row := &rows[i]
		k := rollupKey{minute: row.Minute, Dims: row.Dims}
		sh := r.shardOf(&row.Dims)
		sh.mu.Lock()
		if s := sh.m[k]; s != nil {
			s.add(&row.Sums)
		} else {
			sums := row.Sums
			sh.m[k] = &sums
			r.rows.Add(1)
		}
		sh.mu.Unlock()
	}
}

// take removes every row held and returns them in key order.
func (r *rollups) take() []Row {
	var out []Row
	for i := range r.shard {
		sh := &r.shard[i]
		sh.mu.Lock()
		m := sh.m
		sh.m = make(map[rollupKey]*Sums, len(m))
		sh.mu.Unlock()
		r.rows.Add(-int64(len(m)))
		for k, s := range m {
			out = append(out, Row{Minute: k.minute, Dims: k.Dims, Sums: *s})
		}
	}
	slices.SortFunc(out, func(a, b Row) int { return compareRows(&a, &b) })
	return out
}
