// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package schedule_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/tokenwarden/tokenwarden/proxy/schedule"
)

// TestClassDeadlines: each class waits at most its own deadline; a class without one
// waits the scheduler's.
func TestClassDeadlines(t *testing.T) {
	o := schedule.Options{MaxInFlightRequests: 1, MaxQueueWait: time.Hour}
	o.ClassMaxQueueWait[schedule.Interactive] = 20 * time.Millisecond
	s := schedule.New(o)
	run, _ := s.Acquire(context.Background(), schedule.Request{Tenant: "a"})
	defer run.Done(0, 0)

	batch := make(chan error, 1)
	go func() {
		sl, err := s.Acquire(context.Background(), schedule.Request{Tenant: "b", Class: schedule.Batch})
		sl.Done(0, 0)
		batch <- err
	}()
	waitFor(t, "the batch request to queue", func() bool { return waiting(s) == 1 })

	began := time.Now()
	_, err := s.Acquire(context.Background(), schedule.Request{Tenant: "c", Class: schedule.Interactive})
	var we *schedule.WaitError
	if !errors.As(err, &we) || !errors.Is(err, schedule.ErrQueueTimeout) {
		t.Fatalf("an interactive wait past its class's deadline: %v, want ErrQueueTimeout", err)
	}
	if took := time.Since(began); took > 10*time.Second {
		t.Fatalf("the interactive wait took %v, want about its 20ms deadline", took)
	}
	// Retry-After is at least a second and at most the class's deadline (here under a
	// second, so one second).
	if we.RetryAfter != time.Second {
		t.Fatalf("Retry-After %v, want 1s", we.RetryAfter)
	}
	// The batch request, whose deadline is the scheduler's hour, still waits.
	if n := waiting(s); n != 1 {
		t.Fatalf("%d waiting, want the batch request still queued", n)
	}
	if got := s.MaxQueueWait(schedule.Batch); got != time.Hour {
		t.Fatalf("batch deadline %v, want the scheduler's hour", got)
	}
	run.Done(0, 0)
	if err := <-batch; err != nil {
		t.Fatalf("the batch request: %v", err)
	}
}

// TestDrainRate: Retry-After is the queue's length times the measured time between
// dispatches from it; time with nothing waiting does not count.
func TestDrainRate(t *testing.T) {
	clk := newClock()
	s := schedule.New(schedule.Options{MaxInFlightRequests: 1, MaxQueueLength: 3, MaxQueueWait: time.Hour, Now: clk.Now})
	run, _ := s.Acquire(context.Background(), schedule.Request{Tenant: "a"})
	// A long idle time before anything waits is not drain time.
	clk.advance(time.Hour)
	out := make(chan schedule.Slot, 8)
	queue := func() {
		n := waiting(s)
		go func() {
			sl, err := s.Acquire(context.Background(), schedule.Request{Tenant: "b"})
			if err != nil {
				t.Error(err)
			}
			out <- sl
		}()
		waitFor(t, "a request to queue", func() bool { return waiting(s) == n+1 })
	}
	for range 3 {
		queue()
	}
	// Each dispatch comes 2 seconds after the previous one.
	for range 3 {
		clk.advance(2 * time.Second)
		run.Done(0, 0)
		run = <-out
		queue()
	}
	if got := s.DrainInterval(); got != 2*time.Second {
		t.Fatalf("drain interval %v, want 2s", got)
	}
	// A full queue of three: the request refused would be fourth, 4 × 2s.
	_, err := s.Acquire(context.Background(), schedule.Request{Tenant: "c"})
	var we *schedule.WaitError
	if !errors.As(err, &we) || !errors.Is(err, schedule.ErrQueueFull) || we.RetryAfter != 8*time.Second {
		t.Fatalf("a request past the queue's length: %v (Retry-After %v), want ErrQueueFull after 8s", err, we.RetryAfter)
	}
	for range 3 {
		run.Done(0, 0)
		run = <-out
	}
	run.Done(0, 0)
}

// TestQueueBytes: the bodies waiting are bounded; a request alone may wait whatever
// its size.
func TestQueueBytes(t *testing.T) {
	s := schedule.New(schedule.Options{MaxInFlightRequests: 1, MaxQueueBytes: 1000})
	run, _ := s.Acquire(context.Background(), schedule.Request{Tenant: "a"})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 2)
	go func() { _, err := s.Acquire(ctx, schedule.Request{Tenant: "b", Bytes: 5000}); done <- err }()
	waitFor(t, "the large request to queue alone", func() bool { return waiting(s) == 1 })
	if _, err := s.Acquire(context.Background(), schedule.Request{Tenant: "c", Bytes: 1}); !errors.Is(err, schedule.ErrQueueFull) {
		t.Fatalf("a request past max_queue_bytes: %v, want ErrQueueFull", err)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("the large request: %v", err)
	}
	// Its bytes left with it: two of 400 fit.
	ctx2, cancel2 := context.WithCancel(context.Background())
	defer cancel2()
	for range 2 {
		go func() { _, err := s.Acquire(ctx2, schedule.Request{Tenant: "d", Bytes: 400}); done <- err }()
	}
	waitFor(t, "two requests to queue", func() bool { return waiting(s) == 2 })
	if _, err := s.Acquire(context.Background(), schedule.Request{Tenant: "e", Bytes: 400}); !errors.Is(err, schedule.ErrQueueFull) {
		t.Fatalf("a third of 400 bytes: %v, want ErrQueueFull", err)
	}
	run.Done(0, 0)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	cancel2()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("the last waiter: %v", err)
	}
}
