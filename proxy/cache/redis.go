// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package cache

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Redis is a store shared by a fleet's replicas, in a Redis of its own: never the
// budget counters' Redis, which must not evict, while this one may run allkeys-lru.
// Every failure (unreachable, slow, an entry that does not decode) is a miss or a
// lost write, logged and counted, never a refusal.
type Redis struct {
	client  redis.UniversalClient
	prefix  string
	clock   Clock
	ttl     time.Duration
	timeout time.Duration
	log     *slog.Logger
	counters
}

// RedisOptions configure a Redis store.
type RedisOptions struct {
	// Client is the cache's own client.
	Client redis.UniversalClient
	// Prefix starts every key name ("tokenwarden:cache:" when empty).
	Prefix string
	Clock  Clock
	TTL    time.Duration
	// Timeout bounds each call (50ms when 0): a slow cache is a miss, not a wait.
	Timeout time.Duration
	Log     *slog.Logger
}

// NewRedis is a store on o.Client.
func NewRedis(o RedisOptions) *Redis {
	r := &Redis{client: o.Client, prefix: o.Prefix, clock: o.Clock, ttl: o.TTL, timeout: o.Timeout, log: o.Log}
	if r.prefix == "" {
		r.prefix = "tokenwarden:cache:"
	}
	if r.log == nil {
		r.log = slog.Default()
	}
	if r.timeout <= 0 {
		r.timeout = 50 * time.Millisecond
	}
	return r
}

// tag is a short hash of a scope or model in a key name: the names hold no
// identities, and a purge matches them with SCAN.
func tag(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:6])
}

// name is the entry's key name: prefix, scope tag, model tag, key.
func (r *Redis) name(k Key) string {
	return r.prefix + tag(k.Scope) + ":" + tag(k.Model) + ":" + k.String()
}

// Get implements Store.
func (r *Redis) Get(ctx context.Context, k Key) (*Entry, bool) {
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	b, err := r.client.Get(ctx, r.name(k)).Bytes()
	if err != nil {
		if !errors.Is(err, redis.Nil) {
			r.failed(err, "get")
		}
		return nil, false
	}
	e, err := decodeEntry(b)
	if err != nil {
		r.failed(err, "decode")
		return nil, false
	}
	if r.clock.Now().Sub(e.Stored) >= r.ttl {
		r.expired.Add(1)
		return nil, false
	}
	return e, true
}

// Put implements Store: the entry expires in Redis after the time to live as well.
func (r *Redis) Put(ctx context.Context, k Key, e Entry) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.timeout)
	defer cancel()
	if err := r.client.Set(ctx, r.name(k), e.encode(), r.ttl).Err(); err != nil {
		r.failed(err, "set")
	}
}

// Purge implements Store: SCAN for the matching names on every primary, then UNLINK.
// It is an admin call, bounded by its context rather than the per-call timeout.
func (r *Redis) Purge(ctx context.Context, m Match) (int, error) {
	scope, model := "*", "*"
	if m.Scope != "" {
		scope = tag(m.Scope)
	}
	if m.Model != "" {
		model = tag(m.Model)
	}
	pattern := r.prefix + scope + ":" + model + ":*"
	purge := func(ctx context.Context, c redis.Cmdable) (int, error) {
		n := 0
		iter := c.Scan(ctx, 0, pattern, 1000).Iterator()
		var batch []string
		for iter.Next(ctx) {
			batch = append(batch, iter.Val())
			if len(batch) == 500 {
				if err := c.Unlink(ctx, batch...).Err(); err != nil {
					return n, err
				}
				n, batch = n+len(batch), batch[:0]
			}
		}
		if err := iter.Err(); err != nil {
			return n, err
		}
		if len(batch) > 0 {
			if err := c.Unlink(ctx, batch...).Err(); err != nil {
				return n, err
			}
			n += len(batch)
		}
		return n, nil
	}
	if cc, ok := r.client.(*redis.ClusterClient); ok {
		var total atomic.Int64
		err := cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
			n, err := purge(ctx, c)
			total.Add(int64(n))
			return err
		})
		if err != nil {
			return int(total.Load()), fmt.Errorf("purge the cache: %w", err)
		}
		return int(total.Load()), nil
	}
	n, err := purge(ctx, r.client)
	if err != nil {
		return n, fmt.Errorf("purge the cache: %w", err)
	}
	return n, nil
}

// Stats implements Store.
func (r *Redis) Stats() Stats { return r.stats() }

// failed counts and logs a call that failed; a missing key is no failure.
func (r *Redis) failed(err error, op string) {
	if err == nil {
		return
	}
	r.errors.Add(1)
	r.log.Debug("Cache store call failed; read as a miss", "op", op, "error", err.Error())
}
