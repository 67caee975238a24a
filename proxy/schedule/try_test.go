// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package schedule_test

import (
	"context"
	"testing"

	"github.com/tokenwarden/tokenwarden/proxy/schedule"
)

// TestTryAcquire: a request that may try several upstreams takes one below capacity at
// once, and at capacity, or behind a waiter, is told so without holding, counting or
// queueing anything.
func TestTryAcquire(t *testing.T) {
	clk := newClock()
	s := schedule.New(schedule.Options{MaxInFlightRequests: 1, Now: clk.Now})
	r := schedule.Request{Tenant: "a", Input: 100, Output: 50}
	sl, ok := s.TryAcquire(r)
	if !ok || !sl.Held() {
		t.Fatal("an idle upstream refused a request it has room for")
	}
	if st := s.Stats(); st.InFlightRequests != 1 || st.InFlightTokens != 150 {
		t.Fatalf("in flight %+v, want 1 request and 150 tokens", st)
	}
	if got, ok := s.TryAcquire(r); ok || got.Held() {
		t.Fatal("an upstream at capacity took a request")
	}
	if st := s.Stats(); st.InFlightRequests != 1 || st.InFlightTokens != 150 || waiting(s) != 0 {
		t.Fatalf("a refused try changed the upstream: %+v", st)
	}
	if svc := s.Service("a"); svc != 150 {
		t.Fatalf("service %v, want only the started request's 150", svc)
	}

	// With a request waiting, a try never overtakes it, even as capacity frees.
	out := make(chan schedule.Slot, 1)
	go func() {
		w, _ := s.Acquire(context.Background(), schedule.Request{Tenant: "b"})
		out <- w
	}()
	waitFor(t, "a request to queue", func() bool { return waiting(s) == 1 })
	if _, ok := s.TryAcquire(r); ok {
		t.Fatal("a try overtook a waiting request")
	}
	sl.Done(100, 50)
	w := <-out
	if !w.Held() {
		t.Fatal("the waiting request was not dispatched")
	}
	w.Done(0, 0)
	if st := s.Stats(); st.InFlightRequests != 0 || st.InFlightTokens != 0 || waiting(s) != 0 {
		t.Fatalf("after Done %+v, want nothing in flight or waiting", st)
	}
}

func BenchmarkTryAcquireBelowCapacity(b *testing.B) {
	s := schedule.New(schedule.Options{MaxInFlightRequests: 1 << 30, MaxInFlightTokens: 1 << 40})
	r := schedule.Request{Tenant: "a", Class: schedule.Batch, Input: 1000, Output: 200}
	b.ReportAllocs()
	for b.Loop() {
		sl, ok := s.TryAcquire(r)
		if !ok {
			b.Fatal("refused below capacity")
		}
		sl.Done(900, 150)
	}
}
