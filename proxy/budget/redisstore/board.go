// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package redisstore

import (
	"context"
	"sync"
	"time"
)

// Board is where the fleet's replicas share what is not a budget (health.Board: the
// billing cooldowns of the upstreams' credentials): names under the first slot
// group's prefix, so that one MGET reads them all on a cluster too, written with SET
// and read with MGET, which the least-privilege user may run.
type Board struct{ s *Store }

// Board is the store's board.
func (s *Store) Board() Board { return Board{s} }

func (b Board) key(name string) string { return b.s.groups[0].prefix + name }

// boardTimeout bounds each SET the board sends again.
const boardTimeout = time.Second

// Write sets name to value for ttl. When Redis does not take it, Write returns the
// error and the board sends the value again, after 1 s and then twice as long up to
// 30 s, until it lands or the store closes: a billing clear that failed would
// otherwise leave the cooldown it clears on the board, for the fleet to refuse on. A
// later Write of the name replaces the value waiting, and one name's values are sent
// one at a time, so that an older value never lands over a newer.
func (b Board) Write(ctx context.Context, name string, value []byte, ttl time.Duration) error {
	rec := b.s.board.record(name)
	rec.set(value, time.Now().Add(ttl))
	err := b.send(ctx, name, rec)
	if err != nil {
		b.resend(name, rec)
	}
	return err
}

// send sets rec's last value unless it landed, with what remains of its ttl.
func (b Board) send(ctx context.Context, name string, rec *boardRecord) error {
	rec.sending.Lock()
	defer rec.sending.Unlock()
	value, expires, seq, ok := rec.next()
	if !ok {
		return nil
	}
	if ttl := time.Until(expires); ttl > 0 {
		if err := b.s.c.Set(ctx, b.key(name), value, ttl).Err(); err != nil {
			return err
		}
	}
	rec.landed(seq)
	return nil
}

// resend sends rec's last value again, in the background with a backoff, until one
// lands or the store closes; one resender per name.
func (b Board) resend(name string, rec *boardRecord) {
	if !rec.startResending() {
		return
	}
	b.s.workers.Add(1)
	go func() {
		defer b.s.workers.Done()
		wait := retryFirst
		for attempt := 1; b.s.pause(&wait); attempt++ {
			ctx, cancel := context.WithTimeout(context.Background(), boardTimeout)
			err := b.send(ctx, name, rec)
			cancel()
			if err == nil && rec.doneResending() {
				b.s.log.Info("A board record Redis refused is written", "name", name, "attempts", attempt+1)
				return
			}
		}
		rec.stopResending()
		b.s.log.Warn("The store closed before a board record Redis refused was written", "name", name)
	}()
}

// Read returns the values of names, nil for one that is absent.
func (b Board) Read(ctx context.Context, names []string) ([][]byte, error) {
	keys := make([]string, len(names))
	for i, n := range names {
		keys[i] = b.key(n)
	}
	vals, err := b.s.c.MGet(ctx, keys...).Result()
	if err != nil {
		return nil, err
	}
	out := make([][]byte, len(vals))
	for i, v := range vals {
		if s, ok := v.(string); ok {
			out[i] = []byte(s)
		}
	}
	return out, nil
}

// Claim sets name for ttl unless it is set, and reports whether it did.
func (b Board) Claim(ctx context.Context, name string, ttl time.Duration) (bool, error) {
	return b.s.c.SetNX(ctx, b.key(name), "claimed", ttl).Result()
}

// boardRecords are the names the board has written, each with its last value. They
// are kept (a fleet's credentials: a few), so that one name has one record.
type boardRecords struct {
	mu sync.Mutex
	m  map[string]*boardRecord
}

func (r *boardRecords) record(name string) *boardRecord {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.m == nil {
		r.m = map[string]*boardRecord{}
	}
	rec := r.m[name]
	if rec == nil {
		rec = &boardRecord{}
		r.m[name] = rec
	}
	return rec
}

// boardRecord is one name's last value, numbered, and the number of the last that
// landed.
type boardRecord struct {
	// sending is held across a SET of the name.
	sending   sync.Mutex
	mu        sync.Mutex
	value     []byte
	expires   time.Time
	seq, sent uint64
	resending bool
}

// set makes value, expiring at expires, the name's last.
func (r *boardRecord) set(value []byte, expires time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.seq++
	r.value, r.expires = value, expires
}

// next is the last value and its number; false once it landed.
func (r *boardRecord) next() (value []byte, expires time.Time, seq uint64, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.value, r.expires, r.seq, r.sent < r.seq
}

// landed says the value numbered seq is in Redis.
func (r *boardRecord) landed(seq uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.sent = max(r.sent, seq)
}

// startResending reports whether the caller is the name's resender.
func (r *boardRecord) startResending() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.resending {
		return false
	}
	r.resending = true
	return true
}

// doneResending ends the resender once the last value landed; false while one
// waits (a Write that failed meanwhile left it to the resender).
func (r *boardRecord) doneResending() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.sent < r.seq {
		return false
	}
	r.resending = false
	return true
}

// stopResending ends the resender as the store closes.
func (r *boardRecord) stopResending() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.resending = false
}
