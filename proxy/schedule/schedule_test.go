// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package schedule_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/tokenwarden/tokenwarden/proxy/schedule"
)

// clock is a settable clock whose timers fire as it is advanced past them.
type clock struct {
	mu     sync.Mutex
	now    time.Time
	timers []*timer
	// fired counts the timers fired so far.
	fired int
}

type timer struct {
	at time.Time
	c  chan time.Time
}

func newClock() *clock { return &clock{now: time.Unix(1_700_000_000, 0)} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// After is schedule.Options.After on this clock.
func (c *clock) After(d time.Duration) (<-chan time.Time, func() bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &timer{at: c.now.Add(d), c: make(chan time.Time, 1)}
	c.timers = append(c.timers, t)
	return t.c, func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		i := slices.Index(c.timers, t)
		if i >= 0 {
			c.timers = slices.Delete(c.timers, i, i+1)
		}
		return i >= 0
	}
}

// next returns when the earliest pending timer fires.
func (c *clock) next() (time.Time, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var at time.Time
	for _, t := range c.timers {
		if at.IsZero() || t.at.Before(at) {
			at = t.at
		}
	}
	return at, !at.IsZero()
}

func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	kept := c.timers[:0]
	for _, t := range c.timers {
		if t.at.After(c.now) {
			kept = append(kept, t)
			continue
		}
		t.c <- c.now
		c.fired++
	}
	clear(c.timers[len(kept):])
	c.timers = kept
}

func (c *clock) firedTimers() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.fired
}

type got struct {
	name string
	slot schedule.Slot
	err  error
}

// harness drives a scheduler of capacity one request step by step: requests are queued
// one at a time behind a running one, then served one at a time in the order the
// scheduler picks.
type harness struct {
	t       *testing.T
	s       *schedule.Scheduler
	clk     *clock
	out     chan got
	running schedule.Slot
	runReq  schedule.Request
}

func newHarness(t *testing.T, o schedule.Options) *harness {
	t.Helper()
	clk := newClock()
	o.Now = clk.Now
	if o.MaxInFlightRequests == 0 {
		o.MaxInFlightRequests = 1
	}
	h := &harness{t: t, s: schedule.New(o), clk: clk, out: make(chan got, 1024)}
	// A first request takes the capacity.
	sl, err := h.s.Acquire(context.Background(), schedule.Request{Tenant: "warmup"})
	if err != nil {
		t.Fatal(err)
	}
	h.running = sl
	return h
}

func waiting(s *schedule.Scheduler) int {
	st := s.Stats()
	n := 0
	for _, w := range st.Waiting {
		n += w
	}
	return n
}

// waitFor waits until cond holds, failing after ten seconds.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		runtime.Gosched()
	}
}

// enqueue queues a request and waits until it is in the queue.
func (h *harness) enqueue(ctx context.Context, name string, r schedule.Request) {
	h.t.Helper()
	before := waiting(h.s)
	go func() {
		sl, err := h.s.Acquire(ctx, r)
		h.out <- got{name: name, slot: sl, err: err}
	}()
	waitFor(h.t, "request "+name+" to queue", func() bool { return waiting(h.s) == before+1 })
}

// serve ends the running request (using what it reserved) and returns the one
// dispatched next.
func (h *harness) serve() got {
	h.t.Helper()
	h.running.Done(h.runReq.Input, h.runReq.Output)
	select {
	case g := <-h.out:
		if g.err != nil {
			h.t.Fatalf("%s: %v", g.name, g.err)
		}
		h.running = g.slot
		return g
	case <-time.After(10 * time.Second):
		h.t.Fatal("nothing was dispatched")
	}
	return got{}
}

func TestBelowCapacityNothingWaits(t *testing.T) {
	s := schedule.New(schedule.Options{MaxInFlightRequests: 3, MaxInFlightTokens: 1000})
	var slots []schedule.Slot
	for i := range 3 {
		sl, err := s.Acquire(context.Background(), schedule.Request{Tenant: "a", Input: 100, Output: 100})
		if err != nil || !sl.Held() {
			t.Fatalf("request %d: %v", i, err)
		}
		slots = append(slots, sl)
	}
	if st := s.Stats(); st.InFlightRequests != 3 || st.InFlightTokens != 600 {
		t.Fatalf("in flight %+v, want 3 requests and 600 tokens", st)
	}
	for i := range slots {
		slots[i].Done(100, 50)
		slots[i].Done(100, 50) // a second Done gives nothing back twice
	}
	if st := s.Stats(); st.InFlightRequests != 0 || st.InFlightTokens != 0 {
		t.Fatalf("after Done, in flight %+v, want nothing", st)
	}
}

func TestTokenCapacity(t *testing.T) {
	s := schedule.New(schedule.Options{MaxInFlightTokens: 1000})
	a, _ := s.Acquire(context.Background(), schedule.Request{Tenant: "a", Input: 600})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := s.Acquire(ctx, schedule.Request{Tenant: "b", Input: 500}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a request past the token capacity: %v, want it to wait", err)
	}
	a.Done(600, 0)
	// A request larger than the capacity runs alone rather than never.
	big, err := s.Acquire(context.Background(), schedule.Request{Tenant: "b", Input: 5000})
	if err != nil || !big.Held() {
		t.Fatalf("a request larger than the capacity on an idle upstream: %v", err)
	}
	big.Done(5000, 0)
}

func TestOrder(t *testing.T) {
	type req struct {
		name  string
		r     schedule.Request
		after time.Duration // clock advance after queueing
	}
	cases := []struct {
		name  string
		o     schedule.Options
		reqs  []req
		order []string
	}{{
		name: "classes first, arrival order within a tenant",
		reqs: []req{
			{name: "bg1", r: schedule.Request{Tenant: "x", Class: schedule.Background}},
			{name: "b1", r: schedule.Request{Tenant: "x", Class: schedule.Batch}},
			{name: "b2", r: schedule.Request{Tenant: "x", Class: schedule.Batch}},
			{name: "i1", r: schedule.Request{Tenant: "y", Class: schedule.Interactive}},
		},
		order: []string{"i1", "b1", "b2", "bg1"},
	}, {
		name: "aging serves a batch request that waited past the aging time",
		o:    schedule.Options{Aging: 10 * time.Second},
		reqs: []req{
			{name: "b1", r: schedule.Request{Tenant: "x", Class: schedule.Batch}, after: 11 * time.Second},
			{name: "i1", r: schedule.Request{Tenant: "y", Class: schedule.Interactive}},
			{name: "i2", r: schedule.Request{Tenant: "y", Class: schedule.Interactive}},
		},
		// b1 has aged to interactive and arrived first among them.
		order: []string{"b1", "i1", "i2"},
	}, {
		name: "without aging the same queue is strict",
		reqs: []req{
			{name: "b1", r: schedule.Request{Tenant: "x", Class: schedule.Batch}, after: 11 * time.Second},
			{name: "i1", r: schedule.Request{Tenant: "y", Class: schedule.Interactive}},
			{name: "i2", r: schedule.Request{Tenant: "y", Class: schedule.Interactive}},
		},
		order: []string{"i1", "i2", "b1"},
	}, {
		name: "a class passed over past its minimum share goes first, once",
		o:    schedule.Options{MinShare: [3]float64{0, 0.25, 0}},
		reqs: []req{
			{name: "b1", r: schedule.Request{Tenant: "x", Class: schedule.Batch, Input: 100}},
			{name: "b2", r: schedule.Request{Tenant: "x", Class: schedule.Batch, Input: 100}},
			{name: "i1", r: schedule.Request{Tenant: "y", Class: schedule.Interactive, Input: 100}},
			{name: "i2", r: schedule.Request{Tenant: "y", Class: schedule.Interactive, Input: 100}},
			{name: "i3", r: schedule.Request{Tenant: "y", Class: schedule.Interactive, Input: 100}},
			{name: "i4", r: schedule.Request{Tenant: "y", Class: schedule.Interactive, Input: 100}},
			{name: "i5", r: schedule.Request{Tenant: "y", Class: schedule.Interactive, Input: 100}},
		},
		// Each interactive dispatch credits batch a quarter of its 100 tokens; after
		// three, the 75 cover three quarters of b1's, which goes first and pays them.
		order: []string{"i1", "i2", "i3", "b1", "i4", "i5", "b2"},
	}, {
		name: "within a class the tenant with less service goes first",
		reqs: []req{
			{name: "heavy1", r: schedule.Request{Tenant: "heavy", Class: schedule.Batch, Input: 4000}},
			{name: "heavy2", r: schedule.Request{Tenant: "heavy", Class: schedule.Batch, Input: 4000}},
			{name: "heavy3", r: schedule.Request{Tenant: "heavy", Class: schedule.Batch, Input: 4000}},
			{name: "light1", r: schedule.Request{Tenant: "light", Class: schedule.Batch, Input: 100}},
			{name: "light2", r: schedule.Request{Tenant: "light", Class: schedule.Batch, Input: 100}},
		},
		// heavy1 is first (tie, earlier); then light has 0 < 4000 twice.
		order: []string{"heavy1", "light1", "light2", "heavy2", "heavy3"},
	}, {
		name: "output tokens count output_weight times",
		o:    schedule.Options{OutputWeight: 4},
		reqs: []req{
			{name: "out1", r: schedule.Request{Tenant: "out", Class: schedule.Batch, Output: 1000}},
			{name: "out2", r: schedule.Request{Tenant: "out", Class: schedule.Batch, Output: 1000}},
			{name: "in1", r: schedule.Request{Tenant: "in", Class: schedule.Batch, Input: 3000}},
			{name: "in2", r: schedule.Request{Tenant: "in", Class: schedule.Batch, Input: 3000}},
		},
		// out1 (tie) then in has 0 < 4000: in1 → 3000 < 4000: in2 → 6000 > 4000: out2.
		order: []string{"out1", "in1", "in2", "out2"},
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, tc.o)
			for _, r := range tc.reqs {
				h.enqueue(context.Background(), r.name, r.r)
				h.clk.advance(r.after)
			}
			var order []string
			for range tc.reqs {
				g := h.serve()
				order = append(order, g.name)
				for _, r := range tc.reqs {
					if r.name == g.name {
						h.runReq = r.r
					}
				}
			}
			if fmt.Sprint(order) != fmt.Sprint(tc.order) {
				t.Fatalf("served %v, want %v", order, tc.order)
			}
		})
	}
}

// TestAgingNeverStarves keeps the interactive queue full for ever and checks that a
// batch request is still served within its aging time.
func TestAgingNeverStarves(t *testing.T) {
	h := newHarness(t, schedule.Options{Aging: 5 * time.Second})
	h.enqueue(context.Background(), "batch", schedule.Request{Tenant: "b", Class: schedule.Batch})
	for i := range 3 {
		h.enqueue(context.Background(), fmt.Sprint("i", i), schedule.Request{Tenant: "i", Class: schedule.Interactive})
	}
	for step := range 100 {
		g := h.serve()
		if g.name == "batch" {
			if step != 5 {
				t.Fatalf("batch served at step %d, want 5 (one second a step, aging 5 s)", step)
			}
			return
		}
		// Interactive work keeps arriving, a second a step.
		h.clk.advance(time.Second)
		h.enqueue(context.Background(), fmt.Sprint("i+", step), schedule.Request{Tenant: "i", Class: schedule.Interactive})
	}
	t.Fatal("the batch request was never served")
}

// TestStrictPriorityStarves shows what aging prevents.
func TestStrictPriorityStarves(t *testing.T) {
	h := newHarness(t, schedule.Options{})
	h.enqueue(context.Background(), "batch", schedule.Request{Tenant: "b", Class: schedule.Batch})
	h.enqueue(context.Background(), "i", schedule.Request{Tenant: "i", Class: schedule.Interactive})
	for step := range 20 {
		if g := h.serve(); g.name == "batch" {
			t.Fatalf("strict priority served batch at step %d with interactive waiting", step)
		}
		h.clk.advance(time.Second)
		h.enqueue(context.Background(), fmt.Sprint("i", step), schedule.Request{Tenant: "i", Class: schedule.Interactive})
	}
}

// TestTokenFairness: a heavy tenant sending 4,000-token requests and a light one
// sending 250-token requests, both always backlogged, converge to equal token service
// with equal weights, and to a 3:1 split with weights 3 and 1.
func TestTokenFairness(t *testing.T) {
	for _, tc := range []struct {
		name                      string
		heavyWeight, lightWeight  float64
		wantHeavyShare, tolerance float64
	}{
		{"equal weights", 1, 1, 0.5, 0.05},
		{"heavy weighted 3", 3, 1, 0.75, 0.05},
		{"light weighted 3", 1, 3, 0.25, 0.05},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, schedule.Options{OutputWeight: 2})
			reqs := map[string]schedule.Request{
				"heavy": {Tenant: "heavy", Weight: tc.heavyWeight, Class: schedule.Batch, Input: 3000, Output: 500},
				"light": {Tenant: "light", Weight: tc.lightWeight, Class: schedule.Batch, Input: 150, Output: 50},
			}
			for range 2 {
				h.enqueue(context.Background(), "heavy", reqs["heavy"])
				h.enqueue(context.Background(), "light", reqs["light"])
			}
			served := map[string]float64{}
			for range 400 {
				g := h.serve()
				r := reqs[g.name]
				h.runReq = r
				served[g.name] += float64(r.Input) + 2*float64(r.Output)
				h.enqueue(context.Background(), g.name, r) // always backlogged
			}
			share := served["heavy"] / (served["heavy"] + served["light"])
			if math.Abs(share-tc.wantHeavyShare) > tc.tolerance {
				t.Fatalf("heavy tenant's share of token service %.3f, want %.2f ± %.2f (served %v)",
					share, tc.wantHeavyShare, tc.tolerance, served)
			}
		})
	}
}

// TestIdleTenantEarnsNoCredit: a tenant that starts waiting is lifted to the service
// of those already waiting, so it cannot cash in the time it was idle.
func TestIdleTenantEarnsNoCredit(t *testing.T) {
	h := newHarness(t, schedule.Options{})
	r := schedule.Request{Tenant: "busy", Class: schedule.Batch, Input: 1000}
	// busy is served alone for a while.
	for range 5 {
		h.enqueue(context.Background(), "busy", r)
		h.runReq = r
		h.serve()
	}
	// newcomer arrives with no service: it is lifted to busy's, so it does not get
	// five requests in a row.
	h.enqueue(context.Background(), "busy", r)
	h.enqueue(context.Background(), "busy", r)
	for i := range 3 {
		h.enqueue(context.Background(), fmt.Sprint("new", i), schedule.Request{Tenant: "new", Class: schedule.Batch, Input: 1000})
	}
	var order []string
	for range 5 {
		g := h.serve()
		h.runReq = schedule.Request{Input: 1000}
		order = append(order, g.name)
	}
	if fmt.Sprint(order) != "[busy new0 busy new1 new2]" {
		t.Fatalf("served %v, want the newcomer to alternate with busy", order)
	}
}

func TestLower(t *testing.T) {
	for _, tc := range []struct {
		key, asked, want schedule.Class
	}{
		{schedule.Interactive, schedule.Batch, schedule.Batch},
		{schedule.Interactive, schedule.Background, schedule.Background},
		{schedule.Batch, schedule.Interactive, schedule.Batch}, // raising is ignored
		{schedule.Background, schedule.Interactive, schedule.Background},
		{schedule.Batch, schedule.Batch, schedule.Batch},
	} {
		if got := schedule.Lower(tc.key, tc.asked); got != tc.want {
			t.Errorf("Lower(%v, %v) = %v, want %v", tc.key, tc.asked, got, tc.want)
		}
	}
}

func TestTimeoutAndCancelFreeTheirPlace(t *testing.T) {
	s := schedule.New(schedule.Options{MaxInFlightRequests: 1, MaxQueueWait: 30 * time.Millisecond, MaxQueueLength: 2})
	run, _ := s.Acquire(context.Background(), schedule.Request{Tenant: "a"})

	// A request that waits past the longest wait is refused with a Retry-After.
	_, err := s.Acquire(context.Background(), schedule.Request{Tenant: "b"})
	var we *schedule.WaitError
	if !errors.As(err, &we) || !errors.Is(err, schedule.ErrQueueTimeout) || we.RetryAfter < time.Second {
		t.Fatalf("a wait past the longest: %v, want ErrQueueTimeout with a Retry-After", err)
	}
	if n := waiting(s); n != 0 {
		t.Fatalf("%d still waiting after the timeout", n)
	}

	// A canceled request leaves the queue at once.
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { _, err := s.Acquire(ctx, schedule.Request{Tenant: "c"}); done <- err }()
	waitFor(t, "c to queue", func() bool { return waiting(s) == 1 })
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("canceled wait: %v", err)
	}
	if n := waiting(s); n != 0 {
		t.Fatalf("%d still waiting after the cancel", n)
	}

	// The queue is bounded.
	long := schedule.New(schedule.Options{MaxInFlightRequests: 1, MaxQueueLength: 1})
	hold, _ := long.Acquire(context.Background(), schedule.Request{})
	ctx2, cancel2 := context.WithCancel(context.Background())
	defer cancel2()
	go func() { _, _ = long.Acquire(ctx2, schedule.Request{}) }()
	waitFor(t, "the queue to fill", func() bool { return waiting(long) == 1 })
	if _, err := long.Acquire(context.Background(), schedule.Request{}); !errors.Is(err, schedule.ErrQueueFull) {
		t.Fatalf("a request past max_queue_length: %v, want ErrQueueFull", err)
	}
	hold.Done(0, 0)

	// Nothing leaked: the capacity is whole.
	run.Done(0, 0)
	if st := s.Stats(); st.InFlightRequests != 0 {
		t.Fatalf("in flight %+v after everything ended", st)
	}
}

// TestNoLeakUnderLoad runs many goroutines that acquire, cancel and time out at
// random; at the end nothing is in flight or waiting and no goroutine is left.
func TestNoLeakUnderLoad(t *testing.T) {
	before := runtime.NumGoroutine()
	s := schedule.New(schedule.Options{MaxInFlightRequests: 4, MaxInFlightTokens: 5000, MaxQueueWait: 20 * time.Millisecond,
		MaxQueueLength: 50, Aging: time.Millisecond, OutputWeight: 3, MinShare: [3]float64{0, 0.25, 0.25}})
	var wg sync.WaitGroup
	var mu sync.Mutex
	outcomes := map[string]int{}
	for g := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 50 {
				ctx, cancel := context.WithCancel(context.Background())
				if (g+i)%7 == 0 {
					cancel()
				}
				r := schedule.Request{Tenant: fmt.Sprint("t", g%5), Class: schedule.Class(i % 3), Weight: float64(g%3 + 1),
					Input: int64(100 * (g%4 + 1)), Output: int64(50 * (i%5 + 1))}
				sl, err := s.Acquire(ctx, r)
				outcome := "ok"
				switch {
				case errors.Is(err, schedule.ErrQueueTimeout):
					outcome = "timeout"
				case errors.Is(err, schedule.ErrQueueFull):
					outcome = "full"
				case err != nil:
					outcome = "canceled"
				}
				if err == nil {
					runtime.Gosched()
					sl.Done(r.Input, r.Output/2)
				}
				cancel()
				mu.Lock()
				outcomes[outcome]++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if st := s.Stats(); st.InFlightRequests != 0 || st.InFlightTokens != 0 || waiting(s) != 0 {
		t.Fatalf("after the load: %+v, want nothing held or waiting", st)
	}
	if outcomes["ok"] == 0 {
		t.Fatalf("outcomes %v: nothing ran", outcomes)
	}
	waitFor(t, "the goroutines to end", func() bool { return runtime.NumGoroutine() <= before })
	t.Logf("outcomes %v", outcomes)
}

// TestConfigureKeepsState: raising the capacity dispatches a waiter at once, and what
// is in flight stays counted.
func TestConfigureKeepsState(t *testing.T) {
	s := schedule.New(schedule.Options{MaxInFlightRequests: 1})
	first, _ := s.Acquire(context.Background(), schedule.Request{Tenant: "a", Input: 10})
	done := make(chan schedule.Slot)
	go func() {
		sl, err := s.Acquire(context.Background(), schedule.Request{Tenant: "b", Input: 10})
		if err != nil {
			t.Error(err)
		}
		done <- sl
	}()
	waitFor(t, "b to queue", func() bool { return waiting(s) == 1 })
	s.Configure(schedule.Options{MaxInFlightRequests: 2})
	second := <-done
	if st := s.Stats(); st.InFlightRequests != 2 || st.InFlightTokens != 20 {
		t.Fatalf("after raising the capacity: %+v, want both in flight", st)
	}
	first.Done(10, 0)
	second.Done(10, 0)
	if st := s.Stats(); st.InFlightRequests != 0 || st.InFlightTokens != 0 {
		t.Fatalf("after both ended: %+v", st)
	}
}
