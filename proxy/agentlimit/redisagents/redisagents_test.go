// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package redisagents_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tokenwarden/tokenwarden/proxy/agentlimit"
	"github.com/tokenwarden/tokenwarden/proxy/agentlimit/redisagents"
	"github.com/tokenwarden/tokenwarden/proxy/budget/redisstore"
	"github.com/tokenwarden/tokenwarden/proxy/budget/storetest"
	"github.com/tokenwarden/tokenwarden/test/redisserver"
)

var prefixes atomic.Int64

// replicas are n fleets on the Redis at url under one fresh prefix, sharing clock;
// each has its own store and client, as replicas do.
func replicas(t testing.TB, url string, n int, clock *storetest.Clock) ([]*redisagents.Fleet, []*redisstore.Store) {
	t.Helper()
	prefix := fmt.Sprintf("agents%d", prefixes.Add(1))
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	var fleets []*redisagents.Fleet
	var stores []*redisstore.Store
	for range n {
		st, err := redisstore.New(redisstore.Options{URL: url, Prefix: prefix, Logger: log,
			DialTimeout: time.Second, ReadTimeout: time.Second, WriteTimeout: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = st.Close() })
		stores = append(stores, st)
		fleets = append(fleets, redisagents.New(redisagents.Options{Store: st, Clock: clock, Logger: log}))
	}
	return fleets, stores
}

// take asks f for a slot of alice's max in flight, or refuses.
func take(t *testing.T, f *redisagents.Fleet, a agentlimit.FleetAsk) (agentlimit.FleetHold, agentlimit.FleetVerdict) {
	t.Helper()
	if a.Key == "" {
		a.Key = "alice"
	}
	if a.RunIdle == 0 {
		a.RunIdle = time.Minute
	}
	h, v, err := f.Take(&a)
	if err != nil {
		t.Fatalf("take: %v", err)
	}
	return h, v
}

// eventuallyAdmits waits until f admits a, then ends what it took.
func eventuallyAdmits(t *testing.T, f *redisagents.Fleet, a agentlimit.FleetAsk, what string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		h, v := take(t, f, a)
		if v.Refused == agentlimit.FleetAdmitted {
			h.End(0, true)
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: still refused (%+v)", what, v)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestThreeReplicasHoldOneInFlightTotal(t *testing.T) {
	srv := redisserver.Start(t)
	fleets, _ := replicas(t, srv.URL(), 3, storetest.NewClock())
	ask := agentlimit.FleetAsk{MaxInFlight: 2}
	a, v := take(t, fleets[0], ask)
	if v.Refused != agentlimit.FleetAdmitted {
		t.Fatalf("first slot refused: %+v", v)
	}
	if _, v = take(t, fleets[1], ask); v.Refused != agentlimit.FleetAdmitted {
		t.Fatalf("second slot, on another replica, refused: %+v", v)
	}
	if _, v = take(t, fleets[2], ask); v.Refused != agentlimit.FleetInFlight {
		t.Fatalf("a third request in flight on the third replica: %+v, want the fleet's limit of 2", v)
	}
	if _, v = take(t, fleets[2], agentlimit.FleetAsk{Key: "bob", MaxInFlight: 2}); v.Refused != agentlimit.FleetAdmitted {
		t.Fatalf("another key is limited by alice's: %+v", v)
	}
	a.End(0, false)
	eventuallyAdmits(t, fleets[2], ask, "a slot given back on the first replica")
}

func TestThreeReplicasHoldOneRunTotal(t *testing.T) {
	srv := redisserver.Start(t)
	fleets, _ := replicas(t, srv.URL(), 3, storetest.NewClock())
	ask := agentlimit.FleetAsk{Run: "r1", RunSteps: 4, RunTokens: 300, Cost: 61}
	for i := range 3 {
		h, v := take(t, fleets[i], ask)
		if v.Refused != agentlimit.FleetAdmitted {
			t.Fatalf("step %d refused: %+v", i+1, v)
		}
		h.End(100, false) // each step used 100 of its 61
	}
	// 300 spent: the run's tokens refuse before its fourth step, on any replica.
	waitFor(t, func() bool {
		_, v := take(t, fleets[0], ask)
		return v.Refused == agentlimit.FleetRunTokens && v.Spent == 300 && v.Steps == 3
	}, "the run's 300 tokens spent across three replicas")

	// Steps: a released step is given back, a settled one is not.
	steps := agentlimit.FleetAsk{Run: "r2", RunSteps: 2}
	h, _ := take(t, fleets[0], steps)
	h.End(0, true)
	for i := range 2 {
		h, v := take(t, fleets[1+i], steps)
		if v.Refused != agentlimit.FleetAdmitted {
			t.Fatalf("step %d after a released one refused: %+v", i+1, v)
		}
		h.End(5, false)
	}
	if _, v := take(t, fleets[0], steps); v.Refused != agentlimit.FleetRunSteps || v.Steps != 2 {
		t.Fatalf("a third step of a run of two: %+v", v)
	}
	// The same run id under another key is that key's own run.
	if _, v := take(t, fleets[0], agentlimit.FleetAsk{Key: "bob", Run: "r2", RunSteps: 2}); v.Refused != agentlimit.FleetAdmitted {
		t.Fatalf("bob's run r2 counts alice's: %+v", v)
	}
}

// waitFor polls cond until it holds (the ends are sent without waiting).
func waitFor(t *testing.T, cond func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 5s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestADeadReplicasSlotsEndWithTheirLease(t *testing.T) {
	srv := redisserver.Start(t)
	clock := storetest.NewClock()
	fleets, stores := replicas(t, srv.URL(), 3, clock)
	ask := agentlimit.FleetAsk{MaxInFlight: 2}
	// The first replica holds both slots, the second holds one of bob's.
	take(t, fleets[0], ask)
	take(t, fleets[0], ask)
	live, _ := take(t, fleets[1], agentlimit.FleetAsk{Key: "bob", MaxInFlight: 1})
	// It dies: its store closes under it, it never ends nor renews them.
	_ = stores[0].Close()
	if _, v := take(t, fleets[2], ask); v.Refused != agentlimit.FleetInFlight {
		t.Fatalf("the dead replica's slots are free at once: %+v", v)
	}
	clock.Advance(redisagents.DefaultLease - time.Second)
	if n := fleets[1].Renew(); n != 1 {
		t.Fatalf("the live replica renewed %d keys, want 1", n)
	}
	if _, v := take(t, fleets[2], ask); v.Refused != agentlimit.FleetInFlight {
		t.Fatalf("slots freed before their lease ended: %+v", v)
	}
	clock.Advance(time.Second)
	for i := range 2 {
		if _, v := take(t, fleets[2], ask); v.Refused != agentlimit.FleetAdmitted {
			t.Fatalf("slot %d of the dead replica not freed with its lease: %+v", i+1, v)
		}
	}
	// The live replica renewed its slot: it is still held.
	if _, v := take(t, fleets[2], agentlimit.FleetAsk{Key: "bob", MaxInFlight: 1}); v.Refused != agentlimit.FleetInFlight {
		t.Fatalf("a live replica's renewed slot was freed: %+v", v)
	}
	live.End(0, false)
	eventuallyAdmits(t, fleets[2], agentlimit.FleetAsk{Key: "bob", MaxInFlight: 1}, "the live slot ended")
}

func TestRedisClusterKeepsAKeysLimitsInItsSlotGroup(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a cluster")
	}
	cluster := redisserver.StartCluster(t, 3, 0)
	fleets, _ := replicas(t, cluster.URL(), 3, storetest.NewClock())
	for i := range 20 {
		key := "key-" + strings.Repeat("x", i)
		ask := agentlimit.FleetAsk{Key: key, MaxInFlight: 2, Run: "r", RunSteps: 3}
		for j := range 2 {
			if _, v := take(t, fleets[j], ask); v.Refused != agentlimit.FleetAdmitted {
				t.Fatalf("%s: step %d refused: %+v", key, j+1, v)
			}
		}
		if _, v := take(t, fleets[2], ask); v.Refused != agentlimit.FleetInFlight {
			t.Fatalf("%s: a third in flight on a cluster: %+v", key, v)
		}
	}
}

// fleetCommands are the commands docs/redis.md gives a fleet's Redis user.
var fleetCommands = []string{"+evalsha", "+script|load", "+time", "+mget", "+psetex", "+get", "+set", "+scan"}

func TestTheFleetsRedisUserSuffices(t *testing.T) {
	srv := redisserver.Start(t)
	prefix := fmt.Sprintf("acl%d", prefixes.Add(1))
	args := []any{"ACL", "SETUSER", "fleet", "reset", "on", ">pw", "~{" + prefix + "}:*"}
	for _, c := range fleetCommands {
		args = append(args, c)
	}
	if err := srv.Client().Do(context.Background(), args...).Err(); err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	st, err := redisstore.New(redisstore.Options{URL: "redis://fleet:pw@" + srv.Addr() + "/0", Prefix: prefix, Logger: log,
		DialTimeout: time.Second, ReadTimeout: time.Second, WriteTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	f := redisagents.New(redisagents.Options{Store: st, Clock: storetest.NewClock(), Logger: log})
	ask := agentlimit.FleetAsk{MaxInFlight: 1, Run: "r", RunSteps: 5}
	h, v := take(t, f, ask)
	if v.Refused != agentlimit.FleetAdmitted {
		t.Fatalf("refused: %+v", v)
	}
	if _, v = take(t, f, ask); v.Refused != agentlimit.FleetInFlight {
		t.Fatalf("a second in flight: %+v", v)
	}
	if f.Renew() != 1 {
		t.Fatal("no slot renewed")
	}
	h.End(1, false)
	eventuallyAdmits(t, f, ask, "the slot given back")
}
