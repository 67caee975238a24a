// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package schedule_test

import (
	"context"
	"errors"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/tokenwarden/tokenwarden/proxy/schedule"
)

// simRequest is one request of a simulated world: it arrives at at and, once
// dispatched, holds its capacity for run, then reports used output tokens.
type simRequest struct {
	at, run time.Duration
	r       schedule.Request
	used    int64
}

// simOutcome is what became of a simulated request: started, after wait from its
// arrival, or not, with err.
type simOutcome struct {
	wait    time.Duration
	started bool
	err     error
}

type simResult struct {
	id   int
	slot schedule.Slot
	err  error
}

type completion struct {
	end  time.Duration
	id   int
	slot schedule.Slot
}

// sim drives a Scheduler through a world in simulated time, its deadlines on the same
// clock. Time moves only from one event to the next (an arrival, the end of a
// request, a deadline), once every request the last event woke has acted, so a run is
// the same every time.
type sim struct {
	t       *testing.T
	s       *schedule.Scheduler
	clk     *clock
	start   time.Time
	results chan simResult
	// sent is the requests sent, settled those that reported, timeouts those that
	// reported a deadline.
	sent, settled, timeouts int
	out                     []simOutcome
	arrived                 []time.Duration
	running                 []completion
}

func newSim(t *testing.T, o schedule.Options) *sim {
	clk := newClock()
	o.Now, o.After = clk.Now, clk.After
	return &sim{t: t, s: schedule.New(o), clk: clk, start: clk.Now(), results: make(chan simResult, 1024)}
}

func (m *sim) now() time.Duration { return m.clk.Now().Sub(m.start) }

// run plays the requests (in arrival order) until horizon and returns their outcomes;
// what still waits or runs then is given up.
func (m *sim) run(reqs []simRequest, horizon time.Duration) []simOutcome {
	m.t.Helper()
	m.out = make([]simOutcome, len(reqs))
	m.arrived = make([]time.Duration, len(reqs))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	next := 0
	for {
		at := horizon
		if next < len(reqs) {
			at = min(at, reqs[next].at)
		}
		if len(m.running) > 0 {
			at = min(at, m.running[0].end)
		}
		if deadline, ok := m.clk.next(); ok {
			at = min(at, deadline.Sub(m.start))
		}
		if at >= horizon {
			break
		}
		m.clk.advance(at - m.now())
		switch {
		case len(m.running) > 0 && m.running[0].end == at:
			c := m.running[0]
			m.running = m.running[1:]
			c.slot.Done(reqs[c.id].r.Input, reqs[c.id].used)
		case next < len(reqs) && reqs[next].at == at:
			id := next
			next++
			m.arrived[id] = at
			m.sent++
			go func() {
				sl, err := m.s.Acquire(ctx, reqs[id].r)
				m.results <- simResult{id: id, slot: sl, err: err}
			}()
		}
		m.settle(reqs)
	}
	cancel()
	for m.settled < m.sent {
		m.record(reqs, <-m.results)
	}
	for _, c := range m.running {
		c.slot.Done(0, 0)
	}
	return m.out
}

// settle waits until every request sent either waits or has reported, and every
// deadline fired has ended its wait.
func (m *sim) settle(reqs []simRequest) {
	deadline := time.Now().Add(10 * time.Second)
	for m.settled+waiting(m.s) != m.sent || m.timeouts != m.clk.firedTimers() {
		select {
		case r := <-m.results:
			m.record(reqs, r)
		default:
			if time.Now().After(deadline) {
				m.t.Fatalf("the simulation did not settle: %d sent, %d reported, %d waiting", m.sent, m.settled, waiting(m.s))
			}
			runtime.Gosched()
		}
	}
}

func (m *sim) record(reqs []simRequest, r simResult) {
	m.settled++
	if r.err != nil {
		if errors.Is(r.err, schedule.ErrQueueTimeout) {
			m.timeouts++
		}
		m.out[r.id] = simOutcome{err: r.err}
		return
	}
	now := m.now()
	m.out[r.id] = simOutcome{wait: now - m.arrived[r.id], started: true}
	c := completion{end: now + reqs[r.id].run, id: r.id, slot: r.slot}
	i, _ := slices.BinarySearchFunc(m.running, c, func(a, b completion) int {
		if a.end != b.end {
			return int(a.end - b.end)
		}
		return a.id - b.id
	})
	m.running = slices.Insert(m.running, i, c)
}
