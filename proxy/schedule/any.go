// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package schedule

import (
	"context"
	"errors"
	"math"
	"sync/atomic"
	"time"
)

// Claim states.
const (
	open int32 = iota
	dispatched
	abandoned
)

// claim is one request waiting in several queues at once. Each queue holds a copy of
// it (a waiter) sharing the claim; the scheduler that dispatches a copy first moves
// state from open to dispatched, and any other that picks a copy later finds it taken
// and drops that copy. A wait that ends first moves it to abandoned, so none
// dispatches it.
type claim struct {
	state atomic.Int32
	ready chan struct{}
	// won is the dispatched copy, written before ready is closed.
	won *waiter
}

// AcquireAny is Acquire over several upstreams that may each serve the request (the
// upstreams of one model, in order of preference): it takes the first of them that
// is below capacity with nothing waiting; when none is, the request waits in the
// queue of each (one whose queue is full is left out) and is dispatched exactly once,
// by whichever dispatches it first, and leaves the other queues. It returns the slot
// and the index in ss of the scheduler that holds it. Its longest wait is that of
// the first scheduler it waits at; its errors are Acquire's, and with any error the
// request holds nothing and waits nowhere.
func AcquireAny(ctx context.Context, ss []*Scheduler, r Request) (Slot, int, error) {
	if len(ss) == 1 {
		sl, err := ss[0].Acquire(ctx, r)
		return sl, 0, err
	}
	if r.Weight <= 0 {
		r.Weight = 1
	}
	if r.Class >= numClasses {
		r.Class = Background
	}
	for i, s := range ss {
		if sl, ok := s.TryAcquire(r); ok {
			return sl, i, nil
		}
	}
	cost := r.Input + r.Output
	c := &claim{ready: make(chan struct{})}
	copies := make([]*waiter, len(ss))
	var refused error
	var maxWait time.Duration
	var after func(time.Duration) (<-chan time.Time, func() bool)
	first := -1
	for i, s := range ss {
		s.mu.Lock()
		if c.state.Load() != open {
			s.mu.Unlock()
			break
		}
		if s.o.MaxQueueLength > 0 && s.waiting >= s.o.MaxQueueLength ||
			s.o.MaxQueueBytes > 0 && s.waiting > 0 && s.waitingBytes+r.Bytes > s.o.MaxQueueBytes {
			if refused == nil {
				refused = &WaitError{Err: ErrQueueFull, RetryAfter: s.retryAfterLocked(r.Class)}
			}
			s.mu.Unlock()
			continue
		}
		s.seq++
		w := &waiter{req: r, cost: cost, t: s.tenant(r.Tenant), since: s.o.Now(), seq: s.seq, ready: c.ready, claim: c}
		copies[i] = w
		if first < 0 {
			first, maxWait, after = i, s.maxWaitLocked(r.Class), s.o.After
		}
		s.pushLocked(w)
		s.dispatchLocked()
		s.mu.Unlock()
	}
	if first < 0 {
		for _, s := range ss {
			if s.o.Observer != nil {
				s.mu.Lock()
				s.o.Observer.Left(r.Class, "queue_full", 0)
				s.mu.Unlock()
				break
			}
		}
		return Slot{}, 0, refused
	}

	var timeout <-chan time.Time
	if maxWait > 0 {
		ch, stop := after(maxWait)
		defer stop()
		timeout = ch
	}
	var err error
	select {
	case <-c.ready:
		return won(ss, copies, c), c.won.idx(copies), nil
	case <-ctx.Done():
		err = ctx.Err()
	case <-timeout:
		err = ErrQueueTimeout
	}
	if !c.state.CompareAndSwap(open, abandoned) {
		// Dispatched as the wait ended: the capacity taken is given back.
		<-c.ready
		sl := won(ss, copies, c)
		s := sl.s
		s.mu.Lock()
		s.releaseLocked(sl.cost)
		sl.t.service = math.Max(0, sl.t.service-sl.charged)
		s.serviceChangedLocked(sl.t)
		s.dispatchLocked()
		e := s.waitError(err, r.Class)
		s.mu.Unlock()
		return Slot{}, 0, e
	}
	reason := "canceled"
	if errors.Is(err, ErrQueueTimeout) {
		reason = "queue_timeout"
	}
	for i, w := range copies {
		if w == nil {
			continue
		}
		s := ss[i]
		s.mu.Lock()
		if w.own != nil {
			s.removeLocked(w)
			if s.o.Observer != nil {
				s.o.Observer.Left(r.Class, reason, s.o.Now().Sub(w.since))
			}
			s.dispatchLocked()
		}
		s.mu.Unlock()
	}
	s := ss[first]
	s.mu.Lock()
	e := s.waitError(err, r.Class)
	s.mu.Unlock()
	return Slot{}, 0, e
}

// idx is the index of w among copies.
func (w *waiter) idx(copies []*waiter) int {
	for i, x := range copies {
		if x == w {
			return i
		}
	}
	return -1
}

// won takes the other copies of a dispatched request out of their queues and returns
// the dispatched copy's slot.
func won(ss []*Scheduler, copies []*waiter, c *claim) Slot {
	var sl Slot
	for i, w := range copies {
		if w == nil {
			continue
		}
		s := ss[i]
		if w == c.won {
			sl = Slot{s: s, t: w.t, cost: w.cost, weight: w.req.Weight, charged: w.charged, at: w.at}
			continue
		}
		s.mu.Lock()
		if w.own != nil {
			s.removeLocked(w)
			s.dispatchLocked()
		}
		s.mu.Unlock()
	}
	return sl
}
