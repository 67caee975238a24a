// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package schedule

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"
)

// bruteNext is the order next promises, found by looking at every waiting tenant of the
// class: least service, on a tie the oldest waiter.
func bruteNext(s *Scheduler, c Class) *waiter {
	var pick *waiter
	for _, t := range s.tenants {
		tq := t.queues[c]
		if tq == nil {
			continue
		}
		w := tq.front()
		if pick == nil || t.service < pick.t.service || t.service == pick.t.service && w.seq < pick.seq {
			pick = w
		}
	}
	return pick
}

// TestTenantHeapKeepsOrder drives a scheduler of capacity 2 with 400 random requests
// of 60 tenants in three classes, some canceled while they wait, others done with
// usage unlike what they reserved (which moves their tenant's service while it still
// waits in other classes), and checks after every step that each class's heap offers
// the tenant a look at every waiting tenant would pick, and that every waiter is
// either dispatched or gone at the end.
func TestTenantHeapKeepsOrder(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	obs := &countStarts{}
	s := New(Options{MaxInFlightRequests: 2, OutputWeight: 3, Observer: obs})
	check := func(step string) {
		t.Helper()
		s.mu.Lock()
		defer s.mu.Unlock()
		for c := range s.classes {
			cq := &s.classes[c]
			want := bruteNext(s, Class(c))
			if len(cq.tenants) == 0 {
				if want != nil {
					t.Fatalf("%s: class %d has an empty heap, but %s waits", step, c, want.req.Tenant)
				}
				continue
			}
			for i, tq := range cq.tenants {
				if tq.idx != i || tq.t.queues[c] != tq {
					t.Fatalf("%s: class %d: heap entry %d is out of place", step, c, i)
				}
			}
			if got := cq.tenants[0].front(); got != want {
				t.Fatalf("%s: class %d: the heap serves %s (service %.0f, seq %d), every waiter looked at gives %s (service %.0f, seq %d)",
					step, c, got.req.Tenant, got.t.service, got.seq, want.req.Tenant, want.t.service, want.seq)
			}
		}
	}

	type result struct {
		sl  Slot
		err error
	}
	results := make(chan result)
	var cancels []context.CancelFunc
	var running []Slot
	pending := 0
	for i := range 400 {
		ctx, cancel := context.WithCancel(context.Background())
		cancels = append(cancels, cancel)
		r := Request{Tenant: fmt.Sprint("t", rng.IntN(60)), Class: Class(rng.IntN(3)), Weight: float64(1 + rng.IntN(3)),
			Input: int64(1 + rng.IntN(4000)), Output: int64(1 + rng.IntN(500))}
		pending++
		go func() {
			sl, err := s.Acquire(ctx, r)
			results <- result{sl, err}
		}()
		// Wait until the request has started or queued.
		for !obs.accepted(s, i+1) {
			time.Sleep(50 * time.Microsecond)
		}
		check(fmt.Sprint("after request ", i))
		switch rng.IntN(4) {
		case 0:
			cancels[rng.IntN(len(cancels))]()
		case 1, 2:
			if len(running) > 0 {
				k := rng.IntN(len(running))
				running[k].Done(int64(rng.IntN(8000)), int64(rng.IntN(2000)))
				running = append(running[:k], running[k+1:]...)
			}
		}
		// Collect whatever finished waiting, without blocking.
		for drained := false; !drained; {
			select {
			case res := <-results:
				pending--
				if res.err == nil {
					running = append(running, res.sl)
				}
			default:
				drained = true
			}
		}
		check(fmt.Sprint("after step ", i))
	}
	for _, c := range cancels {
		c()
	}
	for pending > 0 {
		res := <-results
		pending--
		if res.err == nil {
			running = append(running, res.sl)
		}
	}
	for _, sl := range running {
		sl.Done(0, 0)
	}
	check("at the end")
	st := s.Stats()
	if st.InFlightRequests != 0 || st.Waiting != [numClasses]int{} {
		t.Fatalf("at the end: %+v, want nothing in flight or waiting", st)
	}
}

// countStarts counts the requests that started without waiting.
type countStarts struct{ started atomic.Uint64 }

func (o *countStarts) Queued(Class, int)                 {}
func (o *countStarts) Dispatched(Class, time.Duration)   {}
func (o *countStarts) Left(Class, string, time.Duration) {}
func (o *countStarts) Started(Class)                     { o.started.Add(1) }

// accepted reports whether n requests have started at once or queued (seq is counted
// under the scheduler's lock; a start is observed just after it).
func (o *countStarts) accepted(s *Scheduler, n int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return o.started.Load()+s.seq >= uint64(n)
}
