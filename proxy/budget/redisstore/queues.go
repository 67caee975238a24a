// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package redisstore

import (
	"sync"
	"sync/atomic"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
)

// A queue per master on a cluster. A pipeline waits for every reply it carries: on a
// cluster the client sends each master its share and waits for all of them, so one
// call to a master that died or stalls (before it is marked down, and each time its
// backoff ends and a call probes it again) would hold up, for the client's retries
// and timeouts, every call that shared its pipeline. So on a cluster each call goes to
// the queue of the master that serves its slot group, as the client's slot map has it
// (a call whose master the map cannot tell goes to the default queue), each queue with
// its own worker, started when its master first appears; refunds gather per queue the
// same way. A failing master delays only the calls that go to it. One server and a
// Sentinel primary have only the default queue, its one worker and its large
// pipelines.
//
// The calls of one slot group go to one queue, in arrival order, while its master
// serves it; when the slot map moves the group (a failover, a reshard) its next calls
// go to the new master's queue, which may send them before the old queue's last ones
// fail or are redirected. Each queue holds up to callQueue calls. A queue stays, idle,
// when its master leaves the cluster: there are as many as masters ever seen.

// queue is the calls waiting for one worker, and the refunds gathering for it.
type queue struct {
	// node is the master the queue sends to ("" for the default queue).
	node  string
	calls chan call
	// sending counts the calls the worker has taken and not yet answered.
	sending atomic.Int64
	// gathering are the refunds waiting for a pipeline to take them.
	refundMu  sync.Mutex
	gathering *refunds
}

// queues are the store's queues: the default one, and on a cluster one per master.
type queues struct {
	def *queue
	// byNode holds the masters' queues by address.
	byNode sync.Map
	// mu serializes starting a queue with Close: no worker starts after Close.
	mu     sync.Mutex
	all    []*queue
	closed bool
}

// startQueue makes a queue and starts its worker; nil after Close.
func (s *Store) startQueue(node string) *queue {
	s.q.mu.Lock()
	defer s.q.mu.Unlock()
	if s.q.closed {
		return nil
	}
	if q, ok := s.q.byNode.Load(node); ok && node != "" {
		return q.(*queue)
	}
	q := &queue{node: node, calls: make(chan call, callQueue)}
	s.q.all = append(s.q.all, q)
	if node != "" {
		s.q.byNode.Store(node, q)
	}
	s.workers.Add(pipelineWorkers)
	for range pipelineWorkers {
		go s.pipeline(q)
	}
	return q
}

// queueOf is the queue of slot group g: its master's on a cluster, else the default
// one; nil after Close.
func (s *Store) queueOf(g int) *queue {
	if !s.sharded {
		return s.q.def
	}
	node := s.nodeOf(g)
	if node == "" {
		return s.q.def
	}
	if q, ok := s.q.byNode.Load(node); ok {
		return q.(*queue)
	}
	return s.startQueue(node)
}

// closeQueues keeps any queue from starting after Close.
func (s *Store) closeQueues() []*queue {
	s.q.mu.Lock()
	defer s.q.mu.Unlock()
	s.q.closed = true
	return s.q.all
}

// waiting is the number of calls queued or in a pipeline, over every queue.
func (s *Store) waiting() int {
	s.q.mu.Lock()
	defer s.q.mu.Unlock()
	n := 0
	for _, q := range s.q.all {
		n += len(q.calls) + int(q.sending.Load())
	}
	return n
}

// refundQueues splits refunded charges by the queue that sends them: all to the
// default queue off a cluster.
func (s *Store) refundQueues(charges []budget.Charge) ([]*queue, [][]budget.Charge) {
	if !s.sharded {
		return []*queue{s.q.def}, [][]budget.Charge{charges}
	}
	var qs []*queue
	var out [][]budget.Charge
	for _, ch := range charges {
		q := s.queueOf(groupOf(ch.Key))
		if q == nil {
			q = s.q.def // closed: the default queue's gathering is finished at Close
		}
		i := 0
		for i < len(qs) && qs[i] != q {
			i++
		}
		if i == len(qs) {
			qs = append(qs, q)
			out = append(out, nil)
		}
		out[i] = append(out[i], ch)
	}
	return qs, out
}
