// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package redisstore

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"strings"

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
	match := strings.NewReplacer(`*`, `\*`, `?`, `\?`, `[`, `\[`, `]`, `\]`, `\`, `\\`).Replace(s.prefix) + "*"
	var cursor uint64
	for {
		keys, next, err := s.c.Scan(ctx, cursor, match, scanBatch).Result()
		if err != nil {
			return fmt.Errorf("scan the shared buckets: %w", err)
		}
		if len(keys) > 0 {
			if err := s.levels(ctx, keys, dims, fn); err != nil {
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
func (s *Store) levels(ctx context.Context, keys []string, dims map[string]budget.Dimension, fn budget.LevelFunc) error {
	pipe := s.c.Pipeline()
	now := pipe.Time(ctx)
	get := pipe.MGet(ctx, keys...)
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("read the shared buckets: %w", err)
	}
	nowMs := float64(now.Val().UnixMicro()) / 1000
	for i, v := range get.Val() {
		raw, ok := v.(string)
		if !ok || len(raw) != 96 {
			continue // expired since the scan, or not a bucket
		}
		dim, id, ok := strings.Cut(strings.TrimPrefix(keys[i], s.prefix), ":")
		d, known := dims[dim]
		if !ok || !known {
			continue
		}
		for _, kind := range []budget.Kind{budget.TokensMinute, budget.TokensDay} {
			f := func(j int) float64 {
				return math.Float64frombits(binary.LittleEndian.Uint64([]byte(raw[32*int(kind)+8*j:])))
			}
			level, last, capacity, rate := f(0), f(1), f(2), f(3)
			if !(capacity >= 0) {
				continue // an absent slot
			}
			if dt := (nowMs - last) / 1000; dt > 0 {
				level = min(capacity, level+dt*rate)
			}
			fn(budget.Key{Kind: kind, Dim: d, ID: id}, level, capacity)
		}
	}
	return nil
}
