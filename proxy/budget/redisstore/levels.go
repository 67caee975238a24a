// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package redisstore

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
)

// scanBatch is how many keys one SCAN step asks for, and one MGET reads: a usage scan
// of 50,000 subjects is about a hundred short round trips, never one long call that
// would hold Redis up for the fleet's reservations.
const scanBatch = 500

// EachLevel implements budget.Leveler on the fleet's shared buckets: it scans the
// fleet's keys (SCAN with the key prefix, in batches) and reads them with MGET, each
// level brought up to the Redis server's clock. Every replica reads the same buckets,
// so every replica's report holds the fleet's whole use. A key that idled until it
// expired is a full bucket, and is not reported; a key written with other values than
// this store's is skipped.
func (s *Store) EachLevel(ctx context.Context, fn budget.LevelFunc) error {
	dims := map[string]budget.Dimension{}
	for d := budget.Dimension(0); d < budget.NumDimensions; d++ {
		dims[d.String()] = d
	}
	// On one server every key starts with {prefix}:; on a cluster with {prefix:N}:,
	// and every master holds some of them.
	match := strings.NewReplacer(`*`, `\*`, `?`, `\?`, `[`, `\[`, `]`, `\]`, `\`, `\\`).Replace(s.prefix) + "*"
	if s.sharded {
		match = strings.NewReplacer(`*`, `\*`, `?`, `\?`, `[`, `\[`, `]`, `\]`, `\`, `\\`).Replace("{"+s.name+":") + "*"
		cc, ok := s.c.(*redis.ClusterClient)
		if !ok {
			return fmt.Errorf("a sharded store needs a cluster client")
		}
		var mu sync.Mutex
		return cc.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error {
			return s.scan(ctx, node, match, dims, func(k budget.Key, level, capacity float64) {
				mu.Lock()
				defer mu.Unlock()
				fn(k, level, capacity)
			})
		})
	}
	return s.scan(ctx, s.c, match, dims, fn)
}

// scan reads the keys of one server that match.
func (s *Store) scan(ctx context.Context, c redis.Cmdable, match string, dims map[string]budget.Dimension, fn budget.LevelFunc) error {
	var cursor uint64
	for {
		keys, next, err := c.Scan(ctx, cursor, match, scanBatch).Result()
		if err != nil {
			return fmt.Errorf("scan the shared buckets: %w", err)
		}
		if len(keys) > 0 {
			if err := s.levels(ctx, c, keys, dims, fn); err != nil {
				return err
			}
		}
		if next == 0 {
			return nil
		}
		cursor = next
	}
}

// levels reads one batch of keys and reports their token buckets.
func (s *Store) levels(ctx context.Context, c redis.Cmdable, keys []string, dims map[string]budget.Dimension, fn budget.LevelFunc) error {
	pipe := c.Pipeline()
	now := pipe.Time(ctx)
	vals := make([]func() (string, bool), 0, len(keys))
	if s.sharded {
		// A cluster refuses MGET across slots, even on one node.
		for _, k := range keys {
			get := pipe.Get(ctx, k)
			vals = append(vals, func() (string, bool) { v, err := get.Result(); return v, err == nil })
		}
	} else {
		get := pipe.MGet(ctx, keys...)
		for i := range keys {
			vals = append(vals, func() (string, bool) { v, ok := get.Val()[i].(string); return v, ok })
		}
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return fmt.Errorf("read the shared buckets: %w", err)
	}
	nowMs := float64(now.Val().UnixMicro()) / 1000
	for i, val := range vals {
		raw, ok := val()
		if !ok || (len(raw) != 104 && len(raw) != 96) { // 96: the layout before the expiry was stored
			continue // expired since the scan, or not a bucket
		}
		name := keys[i]
		if _, after, ok := strings.Cut(name, "}:"); ok {
			name = after
		}
		if rest, ok := strings.CutPrefix(name, "rule:"); ok {
			if k, ok := ruleKey(rest, dims); ok {
				level, capacity, ok := slotLevel(raw, 0, nowMs)
				if ok {
					if rate(raw, 0) == 0 {
						calendar(&k)
					}
					fn(k, level, capacity)
				}
			}
			continue
		}
		dim, id, ok := strings.Cut(name, ":")
		d, known := dims[dim]
		if !ok || !known {
			continue
		}
		for _, kind := range []budget.Kind{budget.TokensMinute, budget.TokensDay} {
			if level, capacity, ok := slotLevel(raw, int(kind), nowMs); ok {
				fn(budget.Key{Kind: kind, Dim: d, ID: id}, level, capacity)
			}
		}
	}
	return nil
}

// slotField is one number of a key's slot: 0 level, 1 last_ms, 2 capacity, 3 rate.
func slotField(raw string, slot, j int) float64 {
	return math.Float64frombits(binary.LittleEndian.Uint64([]byte(raw[32*slot+8*j:])))
}

func rate(raw string, slot int) float64 { return slotField(raw, slot, 3) }

// slotLevel is a slot's level brought up to now, and its capacity; false for an absent
// slot. A calendar counter's last_ms is its window's end, later than now, so it never
// refills.
func slotLevel(raw string, slot int, nowMs float64) (level, capacity float64, ok bool) {
	level, last, capacity, r := slotField(raw, slot, 0), slotField(raw, slot, 1), slotField(raw, slot, 2), slotField(raw, slot, 3)
	if !(capacity >= 0) {
		return 0, 0, false
	}
	if dt := (nowMs - last) / 1000; dt > 0 {
		level = min(capacity, level+dt*r)
	}
	return level, capacity, true
}

// ruleKey parses a rule counter's key after {prefix}:rule: (see Key):
// RULE:WINDOW:DIMENSION:LEN:ID:BY, with @START for a calendar window. A rule's name
// holds no colon; LEN delimits the id, which may hold colons (an IPv6 client). A key
// that does not parse is skipped. The kind is Rolling; the caller tells a calendar
// counter by its slot (it never refills) and its @START.
func ruleKey(s string, dims map[string]budget.Dimension) (budget.Key, bool) {
	var k budget.Key
	rule, s, ok1 := strings.Cut(s, ":")
	win, s, ok2 := strings.Cut(s, ":")
	dim, s, ok3 := strings.Cut(s, ":")
	n, s, ok4 := strings.Cut(s, ":")
	w, err1 := strconv.ParseUint(win, 10, 8)
	l, err2 := strconv.Atoi(n)
	d, known := dims[dim]
	if !ok1 || !ok2 || !ok3 || !ok4 || err1 != nil || err2 != nil || !known || l < 0 || len(s) < l+1 || s[l] != ':' {
		return k, false
	}
	return budget.Key{Kind: budget.Rolling, Rule: rule, Window: uint8(w), Dim: d, ID: s[:l], By: s[l+1:]}, true
}

// calendar makes k, parsed from a counter that never refills, a calendar window's
// counter when its key ends in @START.
func calendar(k *budget.Key) {
	if at := strings.LastIndexByte(k.By, '@'); at >= 0 {
		if start, err := strconv.ParseInt(k.By[at+1:], 10, 64); err == nil {
			k.By, k.Start, k.Kind = k.By[:at], start, budget.Calendar
		}
	}
}
