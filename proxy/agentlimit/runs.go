// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package agentlimit

import (
	"container/list"
	"sync"
	"time"
)

// runKey names a run: its API key and its run id, so a run is its key's own.
type runKey struct{ key, id string }

// run is one agent run's spending.
type run struct {
	k runKey
	// spent is what ended requests used; held what requests in flight reserved.
	spent, held, steps int64
	seen               time.Time
	elem               *list.Element
}

// runStats is a run's state when a request was refused.
type runStats struct{ spent, steps int64 }

// runTable keeps the runs, bounded in number, most recently seen first; a run idle
// past the idle time, or the least recently seen when the table is full, is forgotten.
type runTable struct {
	mu   sync.Mutex
	m    map[runKey]*run
	lru  list.List // of *run, most recently seen first
	max  int
	idle time.Duration
}

func (t *runTable) configure(maxRuns int, idle time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.max, t.idle = maxRuns, idle
	for t.lru.Len() > t.max {
		t.dropLocked(t.lru.Back().Value.(*run))
	}
}

// idleTime is how long a run is kept idle.
func (t *runTable) idleTime() time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.idle
}

func (t *runTable) dropLocked(r *run) {
	t.lru.Remove(r.elem)
	delete(t.m, r.k)
}

// take counts a request of cost tokens in its run when the key's limits allow it, and
// returns the run; otherwise nil and the run's state.
func (t *runTable) take(now time.Time, k runKey, lim Key, cost int64) (*run, runStats) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.m == nil {
		t.m = map[runKey]*run{}
	}
	for e := t.lru.Back(); e != nil && now.Sub(e.Value.(*run).seen) >= t.idle; e = t.lru.Back() {
		t.dropLocked(e.Value.(*run))
	}
	r := t.m[k]
	if r == nil {
		if t.max > 0 && t.lru.Len() >= t.max {
			t.dropLocked(t.lru.Back().Value.(*run))
		}
		r = &run{k: k}
		r.elem = t.lru.PushFront(r)
		t.m[k] = r
	}
	r.seen = now
	t.lru.MoveToFront(r.elem)
	if lim.RunSteps > 0 && r.steps >= lim.RunSteps || lim.RunTokens > 0 && r.spent+r.held+cost > lim.RunTokens {
		return nil, runStats{spent: r.spent + r.held, steps: r.steps}
	}
	r.steps++
	r.held += cost
	return r, runStats{}
}

// settle ends a request of the run that held held tokens: it used used; released, it
// ran nothing and its step is given back too.
func (t *runTable) settle(r *run, held, used int64, released bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	r.held -= held
	r.spent += used
	if released {
		r.steps--
	}
}
