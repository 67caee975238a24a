// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package server

import (
	"fmt"
	"net/http"
	"time"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/proxy/refusal"
)

// fail ends the request with a JSON error in the route's API family (proxy/refusal),
// recorded for the access log; a refusal with a body is counted by its reason (its
// code, or for a budget's, its limit type) as the request ends. It reports false, so
// that a stage refuses with `return ex.fail(...)`.
func (ex *exchange) fail(status int, code, msg string, b *refusal.Body) bool {
	ex.status = status
	if b != nil {
		ex.refused = code
		if code == "rate_limit_exceeded" {
			ex.refused = b.LimitType
		}
	}
	ex.rec.ErrCode, ex.rec.ErrMsg = code, msg
	refusal.Write(ex.w, ex.route.family, status, code, msg, b)
	return false
}

func (ex *exchange) tooLarge(limit int64) bool {
	return ex.fail(http.StatusRequestEntityTooLarge, "request_too_large",
		fmt.Sprintf("the request body is larger than this proxy's limit of %d bytes", limit), nil)
}

// refuse answers 429 for a budget's refusal, as refusal.Budget describes it.
func (ex *exchange) refuse(r *budget.Refusal, now time.Time) bool {
	msg, b, secs := refusal.Budget(ex.w.Header(), r, &refusal.Request{Decision: &ex.dec, Family: ex.route.family,
		Tokens: ex.est.Total(), Model: ex.est.Model, Patience: ex.rt.retryPatience, Now: now})
	ex.rec.RetryAfterSecond = secs
	if r.Amount == budget.AmountInFlight {
		// As a key's max_in_flight refuses.
		return ex.fail(http.StatusTooManyRequests, "in_flight_limit", msg, b)
	}
	return ex.fail(http.StatusTooManyRequests, "rate_limit_exceeded", msg, b)
}
