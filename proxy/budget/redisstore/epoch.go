// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package redisstore

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
)

// The trust fence. Durable counters (calendar windows and cost amounts) live only in
// Redis; a Redis that restarts without persistence, or is flushed, gives them back
// absent, and an absent counter is a whole budget. So each slot group (today one: the
// fleet's key prefix, whose hash tag every key carries) holds an epoch next to its
// counters, {prefix}:epoch, "<created ms on the Redis clock>-<random>", and every
// reservation that draws on a durable counter checks it in the same script call that
// decides it (no round trip of its own). A replica runs under the epoch its config
// names (rate_limiting.redis.epoch, which the operator records from the fleet's
// reports) or, when it names none, the one it found or created at its first durable
// admission. An epoch absent or other than the one the replica runs under is lost
// state: the durable rules are fenced (503 budget_recovering) until the balances are
// attested (Attest), which writes a new epoch.
//
// A failover to a replica that holds the counters is no loss: the epoch key is
// replicated with them, so the promoted server holds the same epoch and nothing is
// fenced. What asynchronous replication lost in the last moments before the failover
// (at most the writes of the replication lag) is lost unnoticed for the counters as
// for the epoch; see docs/redis.md.

// epochKey is the name of a group's epoch key under its prefix.
const epochKey = "epoch"

// group is one slot group: its key prefix, its epoch key, and its fence.
type group struct {
	// name is the group's name (the key prefix, and on a cluster its number); prefix
	// starts each of its keys, hash tag included; key is its epoch key.
	name, prefix, key string
	// fence is what the group's epoch key held when a durable admission last found it
	// other than the fleet's epoch; nil while the group is trusted.
	fence atomic.Pointer[string]
	// fencedAt is when the fence began (Unix milliseconds); 0 while trusted.
	fencedAt atomic.Int64
}

// trust lifts the group's fence; it reports whether one was up.
func (g *group) trust() bool {
	up := g.fence.Swap(nil) != nil
	g.fencedAt.Store(0)
	return up
}

// want is the epoch the replica runs under; "" before it has one.
func (s *Store) want() string {
	if e := s.epoch.Load(); e != nil {
		return *e
	}
	return ""
}

// EpochCreated is when an epoch was created, on the Redis clock; false when the
// string is not an epoch.
func EpochCreated(epoch string) (time.Time, bool) {
	ms, rest, ok := strings.Cut(epoch, "-")
	if !ok || rest == "" {
		return time.Time{}, false
	}
	n, err := strconv.ParseInt(ms, 10, 64)
	if err != nil || n <= 0 {
		return time.Time{}, false
	}
	return time.UnixMilli(n), true
}

// ValidEpoch tells whether s has an epoch's form.
func ValidEpoch(s string) bool {
	_, ok := EpochCreated(s)
	return ok
}

// newer reports whether epoch a was created after b.
func newer(a, b string) bool {
	ta, _ := EpochCreated(a)
	tb, _ := EpochCreated(b)
	return ta.After(tb)
}

// runScript runs a script by its hash, loading it first when Redis does not have it:
// a fleet's Redis user needs EVALSHA and SCRIPT LOAD, never EVAL (docs/redis.md).
func (s *Store) runScript(ctx context.Context, sc *redis.Script, keys []string, args ...any) *redis.Cmd {
	cmd := sc.EvalSha(ctx, s.c, keys, args...)
	if redis.HasErrorPrefix(cmd.Err(), "NOSCRIPT") {
		if err := sc.Load(ctx, s.c).Err(); err != nil {
			cmd = redis.NewCmd(ctx)
			cmd.SetErr(err)
			return cmd
		}
		cmd = sc.EvalSha(ctx, s.c, keys, args...)
	}
	return cmd
}

func randomPart() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// SetEpoch sets the epoch the replica runs under, as its config names it (a reload
// applies it at once). An empty epoch keeps the one the replica has; an epoch older
// than the one it has (attested here, before the config caught up) is ignored.
func (s *Store) SetEpoch(epoch string) {
	if epoch == "" {
		return
	}
	s.epochMu.Lock()
	defer s.epochMu.Unlock()
	cur := s.want()
	if cur == epoch || (cur != "" && newer(cur, epoch)) {
		return
	}
	s.epoch.Store(&epoch)
	for _, g := range s.groups {
		g.trust() // the next durable admission checks the new epoch
	}
	if cur != "" {
		s.checks.attested() // a newer epoch: the balances were attested
	}
	s.epochChanged()
}

// The store's durable counters run under the trust fence.
var _ budget.Durable = (*Store)(nil)

// Epochs are the replica's epoch of durable counters, reported under the key prefix,
// and whether a slot group is fenced.
func (s *Store) Epochs() []budget.GroupEpoch {
	e := budget.GroupEpoch{Group: s.name, Epoch: s.want(), StoreFence: s.storeFence(), StoreChecks: s.checkResults()}
	for i, g := range s.groups {
		if f := g.fence.Load(); f != nil {
			if !e.Fenced {
				e.Fenced, e.Found = true, *f
			}
			if at := g.fencedAt.Load(); at > 0 && (e.FencedAt == 0 || at < e.FencedAt) {
				e.FencedAt = at
			}
			if s.sharded {
				e.SlotGroups = append(e.SlotGroups, i)
			}
		}
	}
	return []budget.GroupEpoch{e}
}

// ensureEpoch gives the replica the epoch Redis holds, creating one when it holds
// none: a replica whose config names no epoch (a brand-new fleet) does this once, at
// its first durable admission. On a cluster the epoch is read or created in slot group
// 0 and then written into every group that holds none (a replica whose config names
// the epoch never writes it: a group without it is fenced).
func (s *Store) ensureEpoch(ctx context.Context) error {
	s.epochMu.Lock()
	defer s.epochMu.Unlock()
	if s.epoch.Load() != nil {
		return nil
	}
	g := s.groups[0]
	e, err := s.runScript(ctx, epochScript, []string{g.key}, randomPart()).Text()
	if err != nil {
		return err
	}
	if err := s.stampGroups(ctx, e); err != nil {
		return err
	}
	s.log.Info("Durable counters: running under the store's epoch", "group", s.name, "epoch", e)
	s.epoch.Store(&e)
	s.epochChanged()
	return nil
}

// fenced records that a durable admission found group g's epoch other than the one
// the replica runs under, and returns the refusal.
func (s *Store) fenced(g *group, found string) error {
	prev := g.fence.Swap(&found)
	if g.fencedAt.Load() == 0 {
		g.fencedAt.CompareAndSwap(0, time.Now().UnixMilli())
	}
	if prev == nil || *prev != found {
		s.log.Error("Durable counters fenced: the store does not hold the epoch this replica runs under "+
			"(Redis restarted without its data, or was flushed); calendar and cost rules answer 503 until the balances are restored or attested",
			"group", g.name, "expected", s.want(), "found", found)
		s.epochChanged()
	}
	return &budget.RecoveringError{Group: s.name, Expected: s.want(), Found: found}
}

// Attest ends a fence: it writes the given balances (RestoreCharge's charges: each
// counter's capacity, rate, window end and spend) over what Redis holds, or none to
// start the windows from what Redis holds now, and a new epoch, in one atomic call
// per slot group (on one server, one call). The replica runs under the new epoch at
// once; the others when their config names it. It returns the new epoch.
func (s *Store) Attest(ctx context.Context, restore []budget.Charge) (string, error) {
	byGroup := make([][]budget.Charge, len(s.groups))
	for _, ch := range restore {
		if ch.Key.Rule == "" {
			return "", fmt.Errorf("only a rule's counter can be restored, not %v", ch.Key)
		}
		g := 0
		if s.sharded {
			g = groupOf(ch.Key)
		}
		byGroup[g] = append(byGroup[g], ch)
	}
	s.epochMu.Lock()
	defer s.epochMu.Unlock()
	// Group 0 draws the new epoch; the others are given it.
	e := ""
	for i, g := range s.groups {
		keys := make([]string, 0, len(byGroup[i])+1)
		spec := make([]byte, 0, 32*len(byGroup[i]))
		for _, ch := range byGroup[i] {
			keys = append(keys, s.Key(ch.Key))
			for _, v := range []float64{ch.SharedCapacity, ch.SharedRate, float64(ch.EndMillis), ch.Amount} {
				spec = binary.LittleEndian.AppendUint64(spec, math.Float64bits(v))
			}
		}
		keys = append(keys, g.key)
		got, err := s.runScript(ctx, attestScript, keys, randomPart(), spec, e).Text()
		if err != nil {
			return "", fmt.Errorf("slot group %s: %w", g.name, err)
		}
		e = got
	}
	s.epoch.Store(&e)
	for _, g := range s.groups {
		g.trust()
	}
	s.checks.attested()
	s.epochChanged()
	s.log.Warn("Durable counters attested: running under a new epoch", "group", s.name, "epoch", e, "counters_restored", len(restore))
	return e, nil
}

// attestClaimKey is the name, under group 0's prefix, of the claim on an
// attestation from the spend ledger.
const attestClaimKey = "ledger-attestation"

// ClaimAttestation claims the attestation of the durable counters lost under epoch
// lost for ttl: true for the one replica of the fleet that gets it. The claim is kept
// beside the counters, so a store that loses them loses the claim with them, and the
// next loss can be attested again.
func (s *Store) ClaimAttestation(ctx context.Context, lost string, ttl time.Duration) (bool, error) {
	ok, err := s.c.SetNX(ctx, s.groups[0].prefix+attestClaimKey, lost, ttl).Result()
	if err != nil {
		return false, fmt.Errorf("claim the attestation: %w", err)
	}
	return ok, nil
}

// ReleaseAttestation gives a claim up (an attestation that failed), so that another
// try, this replica's or another's, may claim it. It expires the claim rather than
// deleting it: the fleet's Redis user needs no DEL.
func (s *Store) ReleaseAttestation(ctx context.Context) error {
	err := s.c.SetArgs(ctx, s.groups[0].prefix+attestClaimKey, "released", redis.SetArgs{Mode: "XX", TTL: time.Millisecond}).Err()
	if err != nil && !errors.Is(err, redis.Nil) {
		return fmt.Errorf("release the attestation claim: %w", err)
	}
	return nil
}

// StoredEpoch is the epoch the store holds now (slot group 0's), "" when it holds
// none: read, never created.
func (s *Store) StoredEpoch(ctx context.Context) (string, error) {
	e, err := s.c.Get(ctx, s.groups[0].key).Result()
	if errors.Is(err, redis.Nil) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("read the epoch: %w", err)
	}
	return e, nil
}
