// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package schedule_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/tokenwarden/tokenwarden/proxy/schedule"
)

// acquire takes a slot that must be granted at once.
func acquire(t *testing.T, s *schedule.Scheduler) schedule.Slot {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 0)
	defer cancel()
	sl, err := s.Acquire(ctx, schedule.Request{Tenant: "a", Input: 1, Output: 1})
	if err != nil {
		t.Fatalf("a request below the learned bound waited: %v", err)
	}
	return sl
}

func TestLearnedCapacity(t *testing.T) {
	c := newClock()
	s := schedule.New(schedule.Options{MaxInFlightRequests: 8, Now: c.Now,
		Learn: &schedule.Learn{MinInFlightRequests: 2, LatencyThreshold: 5 * time.Second, Cooldown: time.Second}})
	if got := s.Learned(); got != 8 {
		t.Fatalf("the learned bound starts at %d, want max_in_flight_requests 8", got)
	}
	answer := func(status int, after time.Duration) {
		sl := acquire(t, s)
		c.advance(after)
		sl.Answered(status)
		sl.Answered(status) // a second call does not count
		sl.Done(1, 1)
	}
	answer(http.StatusTooManyRequests, 0)
	if got := s.Learned(); got != 4 {
		t.Fatalf("after a 429 the bound is %d, want 8 × 0.5 = 4", got)
	}
	// Answers of requests dispatched before the decrease do not decrease it again
	// within the cooldown.
	answer(http.StatusTooManyRequests, 0)
	if got := s.Learned(); got != 4 {
		t.Fatalf("a 429 within the cooldown lowered the bound to %d", got)
	}
	// A slow answer is an overload too; the bound never falls below its floor.
	answer(http.StatusOK, 6*time.Second)
	answer(http.StatusTooManyRequests, 2*time.Second)
	if got := s.Learned(); got != 2 {
		t.Fatalf("after a slow answer and a 429 the bound is %d, want the floor 2", got)
	}
	// At the bound a request waits.
	a, b := acquire(t, s), acquire(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 0)
	if _, err := s.Acquire(ctx, schedule.Request{Tenant: "a", Input: 1, Output: 1}); err == nil {
		t.Fatal("a request beyond the learned bound of 2 was dispatched")
	}
	cancel()
	a.Answered(http.StatusOK)
	b.Answered(http.StatusOK)
	a.Done(1, 1)
	b.Done(1, 1)
	// Additive increase: good answers add one request per bound's worth, up to the
	// ceiling.
	// (2 + 1/2 + 1/2.5 = 2.9, then + 1/2.9: 3.24.)
	if got := s.Learned(); got != 2 {
		t.Fatalf("after two good answers at 2 the bound is %d, want 2.9, still 2", got)
	}
	answer(http.StatusOK, time.Second)
	if got := s.Learned(); got != 3 {
		t.Fatalf("after three good answers at 2 the bound is %d, want 3", got)
	}
	for range 100 {
		answer(http.StatusOK, time.Second)
	}
	if got := s.Learned(); got != 8 {
		t.Fatalf("after many good answers the bound is %d, want the ceiling 8", got)
	}
}

// A scheduler without learn keeps its configured bound whatever the answers.
func TestNotLearnedCapacity(t *testing.T) {
	s := schedule.New(schedule.Options{MaxInFlightRequests: 3})
	sl := acquire(t, s)
	sl.Answered(http.StatusTooManyRequests)
	sl.Done(1, 1)
	if got := s.Learned(); got != 3 {
		t.Fatalf("without learn a 429 changed the bound to %d", got)
	}
}
