// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package budget

import "context"

// LevelFunc receives one token bucket's or rule counter's state in a usage scan: its
// key, its level brought up to the time of the scan (below zero when in debt) and its
// capacity. A calendar window's counter never refills: its capacity less its level is
// what was spent since the window's start (Key.Start).
type LevelFunc func(k Key, level, capacity float64)

// Leveler is a store whose token buckets can be scanned for a usage report. A scan
// runs off the request path: it never creates, refills or drops a bucket.
type Leveler interface {
	// EachLevel calls fn for every token bucket (minute and day) and every rule
	// counter (rolling and calendar, whatever its amount) the store holds. An absent
	// bucket is a full one, and is not reported.
	EachLevel(ctx context.Context, fn LevelFunc) error
}

// EachLevel implements Leveler. It takes one shard's lock at a time (a 64th of the
// buckets), reads the shard's token buckets into a small buffer, and calls fn after
// the lock is released, so a request waits at most for one shard's copy. The request
// buckets of limits are left out.
func (m *Memory) EachLevel(ctx context.Context, fn LevelFunc) error {
	type entry struct {
		k        Key
		level    float64
		capacity float64
	}
	var buf []entry
	for i := range m.shards {
		if err := ctx.Err(); err != nil {
			return err
		}
		now := m.clock.Now()
		buf = buf[:0]
		sh := &m.shards[i]
		sh.mu.Lock()
		for _, mp := range [...]map[Key]*bucket{sh.m, sh.v} {
			for k, b := range mp {
				if k.Kind == Requests {
					continue
				}
				level := b.level
				if dt := now.Sub(b.last).Seconds(); dt > 0 {
					level = min(b.capacity, level+dt*b.rate)
				}
				buf = append(buf, entry{k, level, b.capacity})
			}
		}
		sh.mu.Unlock()
		for _, e := range buf {
			fn(e.k, e.level, e.capacity)
		}
	}
	return nil
}
