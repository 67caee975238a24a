// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

// Package redisagents keeps the limits for agents (a key's requests in flight, its runs' steps and tokens) and the in-flight windows of rules as the fleet's totals in the budget store's Redis, in leased slots.
package redisagents

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tokenwarden/tokenwarden/proxy/agentlimit"
	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/proxy/budget/redisstore"
)

// DefaultLease is how long a slot in flight is held without its replica renewing it:
// the replica renews its slots every third of it, so a replica that dies frees its
// slots at most this long after it stopped.
const DefaultLease = 30 * time.Second

// backoff is how long the fleet's counts are left to each replica after Redis failed,
// before it is tried again.
const backoff = time.Second

// Options configure a Fleet.
type Options struct {
	// Store is the budget store whose Redis keeps the counts, under its subjects'
	// slot groups.
	Store *redisstore.Store
	// Clock tells the leases' time; nil (or the system clock): the Redis server's.
	Clock budget.Clock
	// Lease is DefaultLease unless set.
	Lease  time.Duration
	Logger *slog.Logger
}

// Fleet is the fleet's limits for agents in Redis. It implements agentlimit.Fleet.
type Fleet struct {
	c     redis.UniversalClient
	store *redisstore.Store
	clock budget.Clock
	lease time.Duration
	log   *slog.Logger
	// id is this replica's part of every slot id; seq counts its slots.
	id  [8]byte
	seq atomic.Uint32
	// held counts this replica's slots by key, which renew keeps leased while any is
	// held; renewing says renew runs.
	mu       sync.Mutex
	held     map[string]int
	renewing bool
	// downUntil is when (Unix nanoseconds, system clock) Redis is tried again.
	downUntil atomic.Int64
}

// New returns the fleet's limits for agents in o.Store's Redis.
func New(o Options) *Fleet {
	if _, sys := o.Clock.(budget.SystemClock); sys {
		o.Clock = nil
	}
	if o.Lease <= 0 {
		o.Lease = DefaultLease
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	f := &Fleet{c: o.Store.Client(), store: o.Store, clock: o.Clock, lease: o.Lease, log: o.Logger, held: map[string]int{}}
	_, _ = rand.Read(f.id[:])
	return f
}

// For is the fleet's limits for agents when store is the Redis store, else nil.
func For(store budget.Store, clock budget.Clock, log *slog.Logger) agentlimit.Fleet {
	rs, ok := store.(*redisstore.Store)
	if !ok {
		return nil
	}
	return New(Options{Store: rs, Clock: clock, Logger: log})
}

var errDown = errors.New("redis: the fleet's limits for agents back off after a failure")

// now is the present in milliseconds for the scripts: 0 for the Redis server's clock.
func (f *Fleet) now() string {
	if f.clock == nil {
		return "0"
	}
	return strconv.FormatInt(f.clock.Now().UnixMilli(), 10)
}

// keys are the Redis keys of the API key name's slots and of its run id ("" none).
func (f *Fleet) keys(name, run string) (slots, runKey string) {
	p := f.store.SubjectPrefix(budget.Key{Dim: budget.APIKey, ID: name}) + "agents:"
	n := strconv.Itoa(len(name)) + ":" + name
	slots = p + "inflight:" + n
	runKey = p + "run:" + n + ":" + run
	return slots, runKey
}

// Take implements agentlimit.Fleet: one script call in the key's slot group.
func (f *Fleet) Take(a *agentlimit.FleetAsk) (agentlimit.FleetHold, agentlimit.FleetVerdict, error) {
	if time.Now().UnixNano() < f.downUntil.Load() {
		return nil, agentlimit.FleetVerdict{}, errDown
	}
	h := &hold{f: f}
	h.slots, h.run = f.keys(a.Key, a.Run)
	var slot []byte
	if a.MaxInFlight > 0 {
		slot = binary.BigEndian.AppendUint32(f.id[:], f.seq.Add(1))
	}
	runFlag := "0"
	if a.Run != "" {
		runFlag, h.held = "1", a.Cost
	}
	ctx := context.Background()
	res, err := f.run(ctx, takeScript, []string{h.slots, h.run}, f.now(), f.lease.Milliseconds(), a.MaxInFlight, slot,
		runFlag, a.RunSteps, a.RunTokens, a.Cost, max(a.RunIdle.Milliseconds(), 1)).Int64Slice()
	if err != nil || len(res) == 0 {
		f.failed(err)
		if err == nil {
			err = errors.New("redis: the take script answered nothing")
		}
		return nil, agentlimit.FleetVerdict{}, err
	}
	if res[0] != 0 {
		v := agentlimit.FleetVerdict{Refused: agentlimit.FleetLimit(res[0])}
		if len(res) == 3 {
			v.Steps, v.Spent = res[1], res[2]
		}
		return nil, v, nil
	}
	if slot != nil {
		h.slot = string(slot)
		f.holding(h.slots)
	}
	h.inRun = a.Run != ""
	return h, agentlimit.FleetVerdict{}, nil
}

// run runs a script by its hash, loading it first when Redis does not have it: the
// fleet's Redis user needs EVALSHA and SCRIPT LOAD, never EVAL (docs/redis.md).
func (f *Fleet) run(ctx context.Context, sc *redis.Script, keys []string, args ...any) *redis.Cmd {
	cmd := sc.EvalSha(ctx, f.c, keys, args...)
	if redis.HasErrorPrefix(cmd.Err(), "NOSCRIPT") {
		if err := sc.Load(ctx, f.c).Err(); err != nil {
			cmd = redis.NewCmd(ctx)
			cmd.SetErr(err)
			return cmd
		}
		cmd = sc.EvalSha(ctx, f.c, keys, args...)
	}
	return cmd
}

// failed backs off from a Redis that did not answer (an error Redis answered is a
// call's own).
func (f *Fleet) failed(err error) {
	var answered redis.Error
	if err == nil || errors.As(err, &answered) {
		return
	}
	f.downUntil.Store(time.Now().Add(backoff).UnixNano())
	f.log.Warn("The fleet's limits for agents are unreachable; each replica counts its own until Redis answers", "error", err)
}

// hold is what a request holds in the fleet's counts.
type hold struct {
	f *Fleet
	// slots and run are the keys; slot the request's slot id ("" none); held the
	// tokens it reserved in its run, when inRun.
	slots, run, slot string
	inRun            bool
	held             int64
}

// End implements agentlimit.FleetHold: the slot and the run's reservation are given
// back by one script call, before the request's handler returns, so that the next
// request on its connection finds them given back. While Redis is unreachable the
// slot's lease ends it.
func (h *hold) End(used int64, released bool) {
	f := h.f
	defer f.ended(h)
	if time.Now().UnixNano() < f.downUntil.Load() {
		return
	}
	runFlag, rel := "0", "0"
	if h.inRun {
		runFlag = "1"
	}
	if released {
		rel = "1"
	}
	err := f.run(context.Background(), endScript, []string{h.slots, h.run}, h.slot, runFlag, h.held, used, rel).Err()
	if err != nil && !errors.Is(err, redis.Nil) {
		f.failed(err)
		// The slot's lease ends it; the run counts the reservation until it is forgotten.
		f.log.Warn("Could not give back a request's limits for agents", "error", err)
	}
}

// holding counts one more slot held in slots and starts renewing.
func (f *Fleet) holding(slots string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.held[slots]++
	if !f.renewing {
		f.renewing = true
		go f.renew()
	}
}

// ended counts a slot of h given back.
func (f *Fleet) ended(h *hold) {
	if h.slot != "" {
		f.release(h.slots)
	}
}

// release counts one slot of slots given back.
func (f *Fleet) release(slots string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.held[slots]--; f.held[slots] <= 0 {
		delete(f.held, slots)
	}
}

// renew renews the replica's slots every third of the lease while it holds any.
func (f *Fleet) renew() {
	t := time.NewTicker(f.lease / 3)
	defer t.Stop()
	for range t.C {
		if f.Renew() == 0 {
			f.mu.Lock()
			if len(f.held) == 0 {
				f.renewing = false
				f.mu.Unlock()
				return
			}
			f.mu.Unlock()
		}
	}
}

// Renew renews the leases of every slot the replica holds now (the fleet does so
// every third of the lease on its own) and returns how many keys it renewed.
func (f *Fleet) Renew() int {
	f.mu.Lock()
	keys := make([]string, 0, len(f.held))
	for k := range f.held {
		keys = append(keys, k)
	}
	f.mu.Unlock()
	for _, k := range keys {
		if err := f.run(context.Background(), renewScript, []string{k}, f.now(), f.lease.Milliseconds(), f.id[:]).Err(); err != nil {
			f.log.Warn("Could not renew the leases of requests in flight", "key", k, "error", err)
		}
	}
	return len(keys)
}
