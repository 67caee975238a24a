// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package schedule

import (
	"container/heap"
	"container/list"
)

// tenantQueue is one tenant's waiters in one class, oldest first, and its place in
// the class's heap.
type tenantQueue struct {
	t       *tenant
	waiters list.List // of *waiter
	idx     int
}

// front is the tenant's oldest waiter of the class.
func (tq *tenantQueue) front() *waiter { return tq.waiters.Front().Value.(*waiter) }

// tenantHeap orders a class's waiting tenants by least service first, on a tie by
// whose oldest waiter arrived first, so that picking the next tenant, adding one and
// moving one are O(log n) in the tenants waiting (container/heap), however many wait.
type tenantHeap []*tenantQueue

func (h tenantHeap) Len() int { return len(h) }

func (h tenantHeap) Less(i, j int) bool {
	a, b := h[i], h[j]
	if a.t.service != b.t.service {
		return a.t.service < b.t.service
	}
	return a.front().seq < b.front().seq
}

func (h tenantHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].idx, h[j].idx = i, j
}

// Push and Pop are container/heap's; use heap.Push and heap.Remove.
func (h *tenantHeap) Push(x any) {
	tq := x.(*tenantQueue)
	tq.idx = len(*h)
	*h = append(*h, tq)
}

func (h *tenantHeap) Pop() any {
	old := *h
	tq := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	tq.idx = -1
	return tq
}

// serviceChangedLocked puts tenant t back in order in every class it waits in, after
// its service changed.
func (s *Scheduler) serviceChangedLocked(t *tenant) {
	for c, tq := range t.queues {
		if tq != nil {
			heap.Fix(&s.classes[c].tenants, tq.idx)
		}
	}
}
