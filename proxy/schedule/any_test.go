// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package schedule_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/tokenwarden/tokenwarden/proxy/schedule"
)

type anyGot struct {
	slot schedule.Slot
	idx  int
	err  error
}

// twoFull returns two schedulers of one request each, both taken.
func twoFull(t *testing.T) ([]*schedule.Scheduler, []schedule.Slot) {
	t.Helper()
	clk := newClock()
	ss := []*schedule.Scheduler{
		schedule.New(schedule.Options{MaxInFlightRequests: 1, Now: clk.Now}),
		schedule.New(schedule.Options{MaxInFlightRequests: 1, Now: clk.Now}),
	}
	var held []schedule.Slot
	for want := range 2 {
		sl, i, err := schedule.AcquireAny(context.Background(), ss, schedule.Request{Tenant: "a"})
		if err != nil || i != want {
			t.Fatalf("request %d went to %d (%v), want the first with room, %d", want, i, err, want)
		}
		held = append(held, sl)
	}
	return ss, held
}

func inFlight(ss []*schedule.Scheduler) (n int64, w int) {
	for _, s := range ss {
		n += s.Stats().InFlightRequests
		w += waiting(s)
	}
	return n, w
}

func TestAcquireAnyDispatchedByFirstToFree(t *testing.T) {
	for _, frees := range []int{0, 1} {
		ss, held := twoFull(t)
		out := make(chan anyGot, 1)
		go func() {
			sl, i, err := schedule.AcquireAny(context.Background(), ss, schedule.Request{Tenant: "b", Input: 10})
			out <- anyGot{sl, i, err}
		}()
		waitFor(t, "the request to wait in both queues", func() bool { return waiting(ss[0]) == 1 && waiting(ss[1]) == 1 })
		held[frees].Done(0, 0)
		g := <-out
		if g.err != nil || g.idx != frees || !g.slot.Held() {
			t.Fatalf("upstream %d freed: dispatched at %d (%v), want %d", frees, g.idx, g.err, frees)
		}
		if n, w := inFlight(ss); n != 2 || w != 0 {
			t.Fatalf("after dispatch %d in flight and %d waiting, want 2 and none: dispatched once, left the other queue", n, w)
		}
		// The other upstream frees: nothing is dispatched there a second time.
		held[1-frees].Done(0, 0)
		if n, _ := inFlight(ss); n != 1 {
			t.Fatalf("%d in flight, want only the dispatched request", n)
		}
		g.slot.Done(10, 0)
		if n, w := inFlight(ss); n != 0 || w != 0 {
			t.Fatalf("%d in flight and %d waiting at the end, want none", n, w)
		}
	}
}

func TestAcquireAnyCanceledLeavesEveryQueue(t *testing.T) {
	ss, held := twoFull(t)
	ctx, cancel := context.WithCancel(context.Background())
	out := make(chan anyGot, 1)
	go func() {
		sl, i, err := schedule.AcquireAny(ctx, ss, schedule.Request{Tenant: "b"})
		out <- anyGot{sl, i, err}
	}()
	waitFor(t, "the request to wait in both queues", func() bool { return waiting(ss[0]) == 1 && waiting(ss[1]) == 1 })
	cancel()
	g := <-out
	if !errors.Is(g.err, context.Canceled) || g.slot.Held() {
		t.Fatalf("a canceled wait ended with %v, holding %v", g.err, g.slot.Held())
	}
	if n, w := inFlight(ss); n != 2 || w != 0 {
		t.Fatalf("%d in flight and %d waiting, want the 2 held and none waiting", n, w)
	}
	for i := range held {
		held[i].Done(0, 0)
	}
	if n, _ := inFlight(ss); n != 0 {
		t.Fatalf("%d in flight after every Done, want none", n)
	}
}

// TestAcquireAnyNoDoubleDispatch runs many requests over three upstreams of two
// places each, some canceled while they wait: no upstream ever runs more than its
// capacity, and everything returns to zero.
func TestAcquireAnyNoDoubleDispatch(t *testing.T) {
	ss := make([]*schedule.Scheduler, 3)
	for i := range ss {
		ss[i] = schedule.New(schedule.Options{MaxInFlightRequests: 2, MinShare: [3]float64{0, 0.5, 0}})
	}
	var mu sync.Mutex
	running := make([]int, len(ss))
	var wg sync.WaitGroup
	for n := range 300 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if n%7 == 0 {
				cancel()
			}
			sl, i, err := schedule.AcquireAny(ctx, ss, schedule.Request{Tenant: "t", Input: 5, Class: schedule.Class(n % 2)})
			if err != nil {
				if sl.Held() {
					t.Error("a failed wait holds a slot")
				}
				return
			}
			mu.Lock()
			running[i]++
			if running[i] > 2 {
				t.Errorf("upstream %d runs %d requests, over its capacity of 2", i, running[i])
			}
			mu.Unlock()
			mu.Lock()
			running[i]--
			mu.Unlock()
			sl.Done(5, 0)
		}()
	}
	wg.Wait()
	if n, w := inFlight(ss); n != 0 || w != 0 {
		t.Fatalf("%d in flight and %d waiting at the end, want none", n, w)
	}
}

// TestAcquireAnyBothFreeAtOnce frees both upstreams back to back, so that the second
// often picks the request's other copy before the request has taken it out: that
// copy is dropped, never dispatched a second time.
func TestAcquireAnyBothFreeAtOnce(t *testing.T) {
	for range 200 {
		ss, held := twoFull(t)
		out := make(chan anyGot, 1)
		go func() {
			sl, i, err := schedule.AcquireAny(context.Background(), ss, schedule.Request{Tenant: "b"})
			out <- anyGot{sl, i, err}
		}()
		waitFor(t, "the request to wait in both queues", func() bool { return waiting(ss[0]) == 1 && waiting(ss[1]) == 1 })
		held[0].Done(0, 0)
		held[1].Done(0, 0)
		g := <-out
		if g.err != nil {
			t.Fatal(g.err)
		}
		if n, w := inFlight(ss); n != 1 || w != 0 {
			t.Fatalf("%d in flight and %d waiting, want the one request dispatched once", n, w)
		}
		g.slot.Done(0, 0)
	}
}
