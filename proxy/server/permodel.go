// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package server

import (
	"context"

	"github.com/tokenwarden/tokenwarden/proxy/schedule"
)

// acquireAny takes a place for a request of a registered model with several upstreams
// (docs/scheduling.md "Models with several upstreams"): the first of them, in
// registry order, that may take it now (speaks its family, breaker closed or probing,
// credential not cooling) and has room (no capacity declared, or below it with
// nothing waiting); when every one is at capacity, the request waits in the queue of
// each and runs on whichever dispatches it first. It sets the request's upstream, the
// candidate its first attempt goes to, and its slot. handled is false for a model
// with one upstream or none that may take it now, without work: the caller then waits
// at the request's upstream as for any other.
func (s *Server) acquireAny(ctx context.Context, ex *exchange, req schedule.Request) (handled bool, err error) {
	mr := ex.try.Model
	if mr == nil || len(mr.Candidates) < 2 {
		return false, nil
	}
	now := s.clock.Now()
	var idx []int
	var ss []*schedule.Scheduler
	for i := 0; ; i++ {
		j, _, _ := mr.Pick(i, ex.route.family, now, false)
		if j < 0 {
			break
		}
		i = j
		up := mr.Candidates[j].Up
		if up.Sched == nil {
			ex.upstream, ex.try.First = up, j
			return true, nil
		}
		if slot, ok := up.Sched.TryAcquire(req); ok {
			ex.upstream, ex.try.First, ex.slot = up, j, slot
			return true, nil
		}
		idx, ss = append(idx, j), append(ss, up.Sched)
	}
	if len(ss) == 0 {
		return false, nil
	}
	// Refusals name the first upstream the request waited at.
	ex.upstream, ex.try.First = mr.Candidates[idx[0]].Up, idx[0]
	slot, k, err := schedule.AcquireAny(ctx, ss, req)
	if err != nil {
		return true, err
	}
	ex.upstream, ex.try.First, ex.slot = mr.Candidates[idx[k]].Up, idx[k], slot
	return true, nil
}
