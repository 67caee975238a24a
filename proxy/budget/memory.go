// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package budget

import (
	"context"
	"fmt"
	"hash/maphash"
	"math"
	"sync"
	"sync/atomic"
	"time"
)

const memoryShards = 64

// Memory keeps buckets in this process, in sharded maps with one entry bound per
// dimension and bucket kind: a flood of new identities on one dimension (every IPv6
// client address is one) fills only that dimension's map, and never makes another
// dimension's buckets fail open. The buckets of client-supplied count_by values (a
// session, a fingerprint) have a map and bound of their own, so a tenant's many keys
// sending new values never fill the map its neighbours' subjects live in. An absent
// bucket is a full one, so Sweep may drop any bucket that refilled, and never drops
// one in debt.
type Memory struct {
	clock      Clock
	seed       maphash.Seed
	maxBuckets atomic.Int64
	counts     [NumDimensions][NumKinds]atomic.Int64
	// valueCount is how many buckets the shards' value maps hold.
	valueCount atomic.Int64
	shards     [memoryShards]memShard
	// values bound the distinct client-supplied count_by values (attributes.go).
	values valueSets
}

type memShard struct {
	mu sync.Mutex
	m  map[Key]*bucket
	// v holds the buckets of client-supplied values (valueCharge).
	v map[Key]*bucket
	_ [32]byte // keep shards on separate cache lines
}

type bucket struct {
	level    float64
	capacity float64
	rate     float64
	last     time.Time
}

// NewMemory returns an empty store whose maps hold at most maxBuckets buckets per
// dimension and kind.
func NewMemory(clock Clock, maxBuckets int64) *Memory {
	m := &Memory{clock: clock, seed: maphash.MakeSeed()}
	m.SetMaxBuckets(maxBuckets)
	for i := range m.shards {
		m.shards[i].m = make(map[Key]*bucket)
		m.shards[i].v = make(map[Key]*bucket)
	}
	return m
}

// SetMaxBuckets changes the per-dimension-and-kind bound; existing buckets stay.
func (m *Memory) SetMaxBuckets(n int64) {
	if n <= 0 {
		n = 1<<63 - 1
	}
	m.maxBuckets.Store(n)
}

// Len is the number of buckets of a kind, over every dimension.
func (m *Memory) Len(k Kind) int64 {
	var n int64
	for d := range m.counts {
		n += m.counts[d][k].Load()
	}
	return n
}

// LenOf is the number of buckets of one dimension and kind: what max_buckets bounds.
func (m *Memory) LenOf(d Dimension, k Kind) int64 { return m.counts[d][k].Load() }

// count is the counter of a key's map.
func (m *Memory) count(k Key) *atomic.Int64 { return &m.counts[k.Dim%NumDimensions][k.Kind%NumKinds] }

// ValueBuckets is the number of buckets of client-supplied values: what max_buckets
// bounds apart from the dimensions' maps.
func (m *Memory) ValueBuckets() int64 { return m.valueCount.Load() }

// valueCharge reports whether c is the bucket of a client-supplied count_by value,
// not its key's overflow subject: it lives in the value maps.
func valueCharge(c *Charge) bool {
	return c.ctr != nil && c.ctr.countBy.Supplied() && !isOverflow(c.Key.By)
}

// mapOf is the map and counter c's bucket lives in, in its (locked) shard.
func (m *Memory) mapOf(sh *memShard, c *Charge) (map[Key]*bucket, *atomic.Int64) {
	if valueCharge(c) {
		return sh.v, &m.valueCount
	}
	return sh.m, m.count(c.Key)
}

// shardOf is a key's shard, by its identity alone: the buckets of one subject share a
// shard, so a request locks one shard per subject rather than one per bucket, and the
// shard costs one string hash instead of a hash of the whole key.
func (m *Memory) shardOf(k Key) int {
	return int(maphash.String(m.seed, k.ID) % memoryShards)
}

// locked is the set of shards an operation holds, on the operation's stack.
type locked struct {
	n   int
	idx [memoryShards]uint8
}

// lockAll locks the shards of every charge in ascending order, so two reservations
// never wait on each other in a cycle; unlock releases them.
func (m *Memory) lockAll(l *locked, groups ...[]Charge) {
	var set [memoryShards]bool
	for _, g := range groups {
		for i := range g {
			set[m.shardOf(g[i].Key)] = true
		}
	}
	l.n = 0
	for i, in := range set {
		if in {
			l.idx[l.n] = uint8(i)
			l.n++
		}
	}
	for _, i := range l.idx[:l.n] {
		m.shards[i].mu.Lock()
	}
}

func (m *Memory) unlock(l *locked) {
	for _, i := range l.idx[:l.n] {
		m.shards[i].mu.Unlock()
	}
}

// get returns the bucket for c brought up to now under c's parameters, creating it
// full when absent. It returns nil when the map of the key's dimension and kind is
// full. The shard is locked.
func (m *Memory) get(c Charge, now time.Time, create bool) *bucket {
	mp, n := m.mapOf(&m.shards[m.shardOf(c.Key)], &c)
	b := mp[c.Key]
	if b == nil {
		if !create {
			return nil
		}
		if n.Add(1) > m.maxBuckets.Load() {
			n.Add(-1)
			return nil
		}
		b = &bucket{level: c.Capacity, capacity: c.Capacity, rate: c.Rate, last: now}
		mp[c.Key] = b
		return b
	}
	b.refill(now)
	if b.capacity != c.Capacity || b.rate != c.Rate {
		b.rebuild(c)
	}
	return b
}

// refill brings the bucket up to now at its rate, from below zero when it is in debt.
func (b *bucket) refill(now time.Time) {
	if dt := now.Sub(b.last).Seconds(); dt > 0 {
		b.level = min(b.capacity, b.level+dt*b.rate)
	}
	b.last = now
}

// rebuild moves the bucket to new parameters keeping the fraction already drawn down,
// so a reload never grants budget: a bucket in debt keeps its (negative) fraction. A
// bucket that had no capacity starts full.
func (b *bucket) rebuild(c Charge) {
	frac := 1.0
	if b.capacity > 0 {
		frac = b.level / b.capacity
	}
	b.level, b.capacity, b.rate = frac*c.Capacity, c.Capacity, c.Rate
}

// Reserve implements Store.
func (m *Memory) Reserve(_ context.Context, r *Reservation) (Result, error) {
	now := m.clock.Now()
	nr, nt := len(r.Requests), len(r.Tokens)
	levels, skipped := make([]float64, nr+nt), make([]bool, nr+nt)
	res := Result{
		Admitted:       true,
		Backend:        m,
		RequestLevels:  levels[:nr:nr],
		TokenLevels:    levels[nr:],
		RequestSkipped: skipped[:nr:nr],
		TokenSkipped:   skipped[nr:],
	}
	var l locked
	m.lockAll(&l, r.Requests, r.Tokens)
	defer m.unlock(&l)

	// Room for the counters of a large policy (limits and a few dozen rules) on the stack.
	var bufR, bufT [32]*bucket
	reqs, err := check(m, r.Requests, now, bufR[:0], res.RequestLevels, res.RequestSkipped, &res.RequestWarned, &res, Requests)
	if err != nil {
		return Result{}, err
	}
	if !res.Admitted {
		return res, nil
	}
	toks, err := check(m, r.Tokens, now, bufT[:0], res.TokenLevels, res.TokenSkipped, &res.TokenWarned, &res, TokensMinute)
	if err != nil {
		return Result{}, err
	}
	take(reqs, nil, res.RequestLevels)
	if !res.Admitted {
		return res, nil
	}
	take(toks, r.Tokens, res.TokenLevels)
	return res, nil
}

// check looks every charge's bucket up and records which cannot cover its amount.
// Skipped buckets (a full map) and warn buckets that cannot cover it come back nil: they
// take nothing. A durable bucket that cannot be created is an UnavailableError.
func check(m *Memory, charges []Charge, now time.Time, bs []*bucket, levels []float64, skipped []bool, warned *[]bool, res *Result, kind Kind) ([]*bucket, error) {
	for i := range charges {
		c := &charges[i]
		b := m.get(*c, now, true)
		if b == nil && valueCharge(c) {
			// The values' map is full (a value admitted before it filled, its bucket
			// swept since): the value counts in its key's overflow subject, which the
			// hold then settles.
			c.Key.By = overflowOf(c.Key)
			b = m.get(*c, now, true)
		}
		bs = append(bs, b)
		if b == nil {
			if c.Durable {
				return nil, &UnavailableError{Err: fmt.Errorf("the %s bucket map of the %s dimension is full, and rule %q must not fail open", c.Key.Kind, c.Key.Dim, c.Key.Rule)}
			}
			skipped[i] = true
			levels[i] = -1
			continue
		}
		levels[i] = b.level
		amount := c.Amount
		if kind == Requests {
			amount = 1
		}
		if amount > b.capacity || b.level < amount {
			if c.Warn {
				if *warned == nil {
					*warned = make([]bool, len(charges))
				}
				(*warned)[i] = true
				bs[i] = nil
				continue
			}
			if res.Admitted {
				res.Admitted, res.Refused = false, i
				res.RefusedBy = kind
				if kind != Requests {
					res.RefusedBy = c.Key.Kind
				}
			}
			res.RetryAfter = max(res.RetryAfter, retryAfter(b.level, amount, *c))
		}
	}
	return bs, nil
}

// take takes each charge's amount from its bucket; 1 from each when charges is nil
// (request counts).
func take(bs []*bucket, charges []Charge, levels []float64) {
	for i, b := range bs {
		if b != nil {
			amount := 1.0
			if charges != nil {
				amount = charges[i].Amount
			}
			b.level -= amount
			levels[i] = b.level
		}
	}
}

// scaled converts an amount recorded under a hold's parameters to the bucket's current
// ones, so a hold taken before a reload settles on what it recorded.
func scaled(amount float64, c Charge, b *bucket) float64 {
	if c.Capacity > 0 && b.capacity != c.Capacity {
		return amount * b.capacity / c.Capacity
	}
	return amount
}

// Refund implements Store.
func (m *Memory) Refund(_ context.Context, charges []Charge) {
	now := m.clock.Now()
	var l locked
	m.lockAll(&l, charges)
	defer m.unlock(&l)
	for _, c := range charges {
		if b := m.getForSettle(c, now); b != nil {
			b.level = min(b.capacity, b.level+scaled(c.Amount, c, b))
		}
	}
}

// Charge implements Store.
func (m *Memory) Charge(_ context.Context, charges []Charge, overage Overage) (taken, debt, levels []float64) {
	now := m.clock.Now()
	n := len(charges)
	all := make([]float64, 3*n)
	taken, debt, levels = all[:n:n], all[n:2*n:2*n], all[2*n:]
	var l locked
	m.lockAll(&l, charges)
	defer m.unlock(&l)
	for i, c := range charges {
		b := m.getForSettle(c, now)
		if b == nil {
			// An absent bucket is full: charge it by creating it.
			b = m.get(c, now, true)
		}
		if b == nil {
			levels[i] = math.NaN()
			continue
		}
		a := scaled(c.Amount, c, b)
		level := b.level
		switch {
		case level >= a:
			b.level = level - a
		case c.Key.Kind == Calendar:
			// A calendar counter records the whole usage.
			b.level = level - a
		case overage == Debt && level > -b.capacity:
			b.level = max(level-a, -b.capacity)
		}
		taken[i] = unscaled(max(0, level-b.level), c, b)
		debt[i] = unscaled(max(0, min(level, 0)-b.level), c, b)
		levels[i] = unscaled(b.level, c, b)
	}
	return taken, debt, levels
}

// unscaled converts an amount in the bucket's current parameters back to the ones
// recorded on the charge: the inverse of scaled.
func unscaled(amount float64, c Charge, b *bucket) float64 {
	if c.Capacity > 0 && b.capacity != c.Capacity && b.capacity > 0 {
		return amount * c.Capacity / b.capacity
	}
	return amount
}

// getForSettle returns an existing bucket brought up to now under its own current
// parameters; settlement never rebuilds a bucket to the hold's old ones.
func (m *Memory) getForSettle(c Charge, now time.Time) *bucket {
	mp, _ := m.mapOf(&m.shards[m.shardOf(c.Key)], &c)
	b := mp[c.Key]
	if b != nil {
		b.refill(now)
	}
	return b
}

// Level reports a bucket's current level and whether it exists (tests and /admin).
func (m *Memory) Level(k Key) (float64, bool) {
	sh := &m.shards[m.shardOf(k)]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	b := sh.m[k]
	if b == nil {
		b = sh.v[k]
	}
	if b == nil {
		return 0, false
	}
	b.refill(m.clock.Now())
	return b.level, true
}

// Prune implements Store.
func (m *Memory) Prune(keep func(Key) bool) {
	m.deleteIf(func(k Key, _ *bucket) bool { return !keep(k) })
}

// Sweep drops every bucket that has refilled to capacity: an absent bucket is a full
// one, so this frees memory without changing any decision. A bucket in debt, or only
// partly refilled, stays.
func (m *Memory) Sweep() {
	now := m.clock.Now()
	m.deleteIf(func(_ Key, b *bucket) bool {
		b.refill(now)
		return b.level >= b.capacity
	})
}

func (m *Memory) deleteIf(drop func(Key, *bucket) bool) {
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.Lock()
		for k, b := range sh.m {
			if drop(k, b) {
				delete(sh.m, k)
				m.count(k).Add(-1)
			}
		}
		for k, b := range sh.v {
			if drop(k, b) {
				delete(sh.v, k)
				m.valueCount.Add(-1)
			}
		}
		sh.mu.Unlock()
	}
}

// Close implements Store.
func (m *Memory) Close() error { return nil }

// Peek implements Peeker: the bucket's level in this replica's memory, its capacity
// when it holds none (an absent bucket is full).
func (m *Memory) Peek(_ context.Context, ch Charge) (float64, bool, error) {
	if level, ok := m.Level(ch.Key); ok {
		return level, false, nil
	}
	return ch.Capacity, false, nil
}
