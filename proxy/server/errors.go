// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package server

import (
	"fmt"
	"net/http"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/proxy/refusal"
)

// fail ends the request with a JSON error in the route's API family (proxy/refusal),
// counted and recorded for the access log.
func (ex *exchange) fail(w http.ResponseWriter, status int, code, msg string, b *refusal.Body) {
	ex.status = status
	if b != nil {
		ex.countRefusal(code, b.LimitType)
	}
	ex.rec.ErrCode, ex.rec.ErrMsg = code, msg
	refusal.Write(w, ex.route.family, status, code, msg, b)
}

func (ex *exchange) tooLarge(w http.ResponseWriter, limit int64) {
	ex.fail(w, http.StatusRequestEntityTooLarge, "request_too_large",
		fmt.Sprintf("the request body is larger than this proxy's limit of %d bytes", limit), nil)
}

// refuse answers 429 for a budget's refusal, as refusal.Budget describes it.
func (ex *exchange) refuse(w http.ResponseWriter, r *budget.Refusal) {
	msg, b, secs := refusal.Budget(w.Header(), r, &refusal.Request{Decision: &ex.dec, Family: ex.route.family,
		Tokens: ex.est.Total(), Model: ex.est.Model, Patience: ex.rt.retryPatience, Now: ex.s.clock.Now()})
	ex.rec.RetryAfterSecond = secs
	ex.fail(w, http.StatusTooManyRequests, "rate_limit_exceeded", msg, b)
}
