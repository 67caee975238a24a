// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package server

import (
	"errors"
	"math"
	"net/http"
	"strconv"

	"github.com/tokenwarden/tokenwarden/proxy/accesslog"
	"github.com/tokenwarden/tokenwarden/proxy/refusal"
	"github.com/tokenwarden/tokenwarden/proxy/schedule"
)

// wait takes the request's place in its upstream's capacity: at once below it, after a
// wait in the upstream's queue at it. The class is the key's (interactive for
// anonymous requests), lowered by the x-tokenwarden-priority header and never
// raised. A wait that ends without a place answers 429 queue_timeout or queue_full
// with a Retry-After (nothing, when the client went away) and reports false; the
// caller's deferred release then gives the reservation back.
func (s *Server) wait(ex *exchange, sc *schedule.Scheduler) bool {
	r := ex.r
	req := schedule.Request{Class: ex.agent.Class, Weight: 1, Input: ex.est.Input, Output: ex.est.Output, Bytes: max(r.ContentLength, 0)}
	if key := ex.key; key != nil {
		req.Tenant, req.Weight = key.Name, ex.rt.sched(key.Name).weight
	}
	handled, err := s.acquireAny(r.Context(), ex, req)
	if !handled {
		ex.slot, err = sc.Acquire(r.Context(), req)
	}
	if err == nil {
		return true
	}
	var we *schedule.WaitError
	if !errors.As(err, &we) {
		ex.status = 499 // the client closed the request while it waited
		return false
	}
	secs := int64(math.Ceil(we.RetryAfter.Seconds()))
	ex.rec.Decision, ex.rec.Queue, ex.rec.RetryAfterSecond = accesslog.Refused, true, secs
	h := ex.w.Header()
	h.Set("Retry-After", strconv.FormatInt(secs, 10))
	h.Set("Retry-After-Ms", strconv.FormatInt(we.RetryAfter.Milliseconds(), 10))
	details := map[string]any{"retry_after_seconds": secs, "retryable": true, "class": req.Class.String()}
	code, msg := "queue_timeout", "the request waited for the upstream "+ex.upstream.Name+"'s capacity for the longest wait allowed; retry later"
	if errors.Is(err, schedule.ErrQueueFull) {
		code, msg = "queue_full", "the queue for the upstream "+ex.upstream.Name+"'s capacity is full; retry later"
	}
	return ex.fail(http.StatusTooManyRequests, code, msg, &refusal.Body{LimitType: "queue", Details: details})
}
