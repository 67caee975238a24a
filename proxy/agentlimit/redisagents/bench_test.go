// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package redisagents_test

import (
	"context"
	"testing"
	"time"

	"github.com/tokenwarden/tokenwarden/proxy/agentlimit"
	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/proxy/budget/storetest"
	"github.com/tokenwarden/tokenwarden/test/redisserver"
)

// BenchmarkTakeAndEnd is what a request of a key with max_in_flight and a run budget
// adds on a loopback Redis: its take and its end, two script calls.
func BenchmarkTakeAndEnd(b *testing.B) {
	srv := redisserver.Start(b)
	fleets, _ := replicas(b, srv.URL(), 1, storetest.NewClock())
	f := fleets[0]
	ask := agentlimit.FleetAsk{Key: "alice", MaxInFlight: 64, Run: "r", RunTokens: 1 << 50, Cost: 100, RunIdle: time.Minute}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			a := ask
			h, v, err := f.Take(&a)
			if err != nil || v.Refused != agentlimit.FleetAdmitted {
				b.Errorf("take: %v %+v", err, v)
				return
			}
			h.End(90, false)
		}
	})
}

// BenchmarkTakeSlotsAndEnd is what a rule's in-flight window (a session's) adds to a
// request on a loopback Redis: its slot's take and its end, two script calls.
func BenchmarkTakeSlotsAndEnd(b *testing.B) {
	srv := redisserver.Start(b)
	fleets, _ := replicas(b, srv.URL(), 1, storetest.NewClock())
	f := fleets[0]
	asks := []budget.SlotAsk{{Key: budget.Key{Kind: budget.InFlight, Dim: budget.APIKey, ID: "alice", Rule: "two-per-session", By: "s1"}, Limit: 1 << 20}}
	ctx := context.Background()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			h, refused, err := f.TakeSlots(ctx, asks)
			if err != nil || refused >= 0 {
				b.Errorf("take: %v %d", err, refused)
				return
			}
			h.End()
		}
	})
}
