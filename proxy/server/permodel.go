// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package server

import "github.com/tokenwarden/tokenwarden/proxy/schedule"

// takeAny gives a request of a registered model with several upstreams the first of
// them, in registry order, that may take it now (speaks its family, breaker closed or
// probing, credential not cooling) and has room: no capacity declared, or below it
// with nothing waiting. It then sets the request's upstream, and slot when that
// upstream has a scheduler, and reports true. When every one is at capacity it
// reports false, with the request's upstream set to the first that may take it, in
// whose queue the request then waits (docs/scheduling.md "Models with several
// upstreams"). A model with one upstream reports false at once, without work.
func (ex *exchange) takeAny(req schedule.Request) bool {
	mr := ex.try.model
	if mr == nil || len(mr.candidates) < 2 {
		return false
	}
	now := ex.s.clock.Now()
	wait := -1
	for i := 0; ; i++ {
		j, _ := ex.next(i, now, false)
		if j < 0 {
			break
		}
		i = j
		up := mr.candidates[j].up
		if wait < 0 && up.sched != nil {
			wait = j
		}
		if up.sched == nil {
			ex.upstream, ex.try.first = up, j
			return true
		}
		if slot, ok := up.sched.TryAcquire(req); ok {
			ex.upstream, ex.try.first, ex.slot = up, j, slot
			return true
		}
	}
	if wait >= 0 {
		ex.upstream, ex.try.first = mr.candidates[wait].up, wait
	}
	return false
}
