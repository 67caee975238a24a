// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package redisstore

import (
	"context"
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

// Write sets name to value for ttl.
func (b Board) Write(ctx context.Context, name string, value []byte, ttl time.Duration) error {
	return b.s.c.Set(ctx, b.key(name), value, ttl).Err()
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
