// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package server

import (
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
)

// openAIError is the OpenAI error shape, with this proxy's limit_type and details.
type openAIError struct {
	Error struct {
		Message   string         `json:"message"`
		Type      string         `json:"type"`
		Code      string         `json:"code"`
		Param     *string        `json:"param"`
		LimitType string         `json:"limit_type,omitempty"`
		Details   map[string]any `json:"details,omitempty"`
	} `json:"error"`
}

// anthropicError is the Anthropic error shape, with limit_type and details.
type anthropicError struct {
	Type  string `json:"type"`
	Error struct {
		Type      string         `json:"type"`
		Message   string         `json:"message"`
		LimitType string         `json:"limit_type,omitempty"`
		Details   map[string]any `json:"details,omitempty"`
	} `json:"error"`
}

func openAIType(status int) string {
	switch status {
	case http.StatusTooManyRequests:
		return "rate_limit_exceeded"
	case http.StatusUnauthorized:
		return "authentication_error"
	case http.StatusBadRequest, http.StatusNotFound, http.StatusRequestEntityTooLarge:
		return "invalid_request_error"
	default:
		return "server_error"
	}
}

func anthropicType(status int) string {
	switch status {
	case http.StatusTooManyRequests:
		return "rate_limit_error"
	case http.StatusUnauthorized:
		return "authentication_error"
	case http.StatusNotFound:
		return "not_found_error"
	case http.StatusRequestEntityTooLarge:
		return "request_too_large"
	case http.StatusBadRequest:
		return "invalid_request_error"
	case http.StatusServiceUnavailable:
		return "overloaded_error"
	default:
		return "api_error"
	}
}

// fail answers with a JSON error in the route's API family.
func (ex *exchange) fail(w http.ResponseWriter, status int, code, msg string, refusal *refusalBody) {
	ex.status = status
	var body any
	if ex.route.family == Anthropic {
		var e anthropicError
		e.Type = "error"
		e.Error.Type = anthropicType(status)
		e.Error.Message = msg
		if refusal != nil {
			e.Error.LimitType, e.Error.Details = refusal.limitType, refusal.details
		}
		body = &e
	} else {
		var e openAIError
		e.Error.Message = msg
		e.Error.Type = openAIType(status)
		e.Error.Code = code
		if refusal != nil {
			e.Error.LimitType, e.Error.Details = refusal.limitType, refusal.details
		}
		body = &e
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(body)
}

func (ex *exchange) tooLarge(w http.ResponseWriter, limit int64) {
	ex.fail(w, http.StatusRequestEntityTooLarge, "request_too_large",
		fmt.Sprintf("the request body is larger than this proxy's limit of %d bytes", limit), nil)
}

type refusalBody struct {
	limitType string
	details   map[string]any
}

// refuse answers 429 for a refusal: Retry-After from the refused request's own cost,
// the caller's own bucket levels, and nothing about a shared bucket's level.
func (ex *exchange) refuse(w http.ResponseWriter, r *budget.Refusal) {
	h := w.Header()
	now := ex.s.clock.Now()
	setLimitHeaders(h, &ex.dec, now)
	secs := int64(math.Ceil(r.RetryAfter.Seconds()))
	if secs < 1 {
		secs = 1
	}
	h.Set("Retry-After", strconv.FormatInt(secs, 10))
	h.Set("Retry-After-Ms", strconv.FormatInt(max(r.RetryAfter.Milliseconds(), 1), 10))

	details := map[string]any{"retry_after_seconds": secs}
	rb := &refusalBody{details: details}
	var msg string
	if r.Requests {
		rb.limitType = "requests"
		details["dimension"] = r.Dimension.String()
		msg = fmt.Sprintf("request rate limit exceeded on the %s dimension; retry after %ds", r.Dimension, secs)
	} else {
		rb.limitType = "token_budget"
		details["token_dimension"] = r.Dimension.String()
		details["requested_tokens"] = ex.est.Total()
		if r.BothPeriods {
			details["token_budget"] = r.Period.String()
		}
		if r.Dimension == budget.Model {
			details["model"] = ex.est.Model
		}
		if r.Bucket.Present {
			details["capacity"] = r.Bucket.Limit
			details["remaining"] = r.Bucket.Remaining
			var hw headerWriter
			if r.Period == budget.TokensDay {
				hw.day(r.Bucket)
			} else {
				hw.minute(r.Bucket)
				hw.openAITokens(r.Bucket, now)
			}
			hw.flush(h)
		}
		msg = fmt.Sprintf("token budget exceeded on the %s dimension (%s budget): this request reserves %d tokens; retry after %ds",
			r.Dimension, r.Period, ex.est.Total(), secs)
	}
	ex.fail(w, http.StatusTooManyRequests, "rate_limit_exceeded", msg, rb)
}

// setLimitHeaders reports the caller's own buckets: its api_key token budgets (the
// x-ratelimit-tokens-* families and OpenAI's names for the minute budget) and
// its request-count quota. Shared dimensions are never reported.
func setLimitHeaders(h http.Header, d *budget.Decision, now time.Time) {
	var hw headerWriter
	if d.KeyMinute.Present {
		hw.minute(d.KeyMinute)
		hw.openAITokens(d.KeyMinute, now)
	}
	if d.KeyDay.Present {
		hw.day(d.KeyDay)
	}
	if s := d.KeyRequests; s.Present {
		hw.int("X-Ratelimit-Limit", s.Limit)
		hw.int("X-Ratelimit-Remaining", s.Remaining)
		hw.int("X-Ratelimit-Reset", unixCeil(s.Reset))
		hw.int("X-Ratelimit-Limit-Requests", s.Limit)
		hw.int("X-Ratelimit-Remaining-Requests", s.Remaining)
		hw.duration("X-Ratelimit-Reset-Requests", s.Reset, now)
	}
	hw.flush(h)
}

// headerWriter sets a batch of headers with two allocations: every value is formatted
// into one buffer that becomes one string, and the value slices share one backing
// array. The rate limit headers are on every answer, so this is the hot path.
type headerWriter struct {
	keys [20]string
	ends [20]int
	n    int
	buf  [384]byte
	b    []byte
}

func (w *headerWriter) add(key string) {
	w.keys[w.n] = key
	w.ends[w.n] = len(w.b)
	w.n++
}

func (w *headerWriter) int(key string, v int64) {
	if w.b == nil {
		w.b = w.buf[:0]
	}
	w.b = strconv.AppendInt(w.b, v, 10)
	w.add(key)
}

func (w *headerWriter) duration(key string, reset, now time.Time) {
	if w.b == nil {
		w.b = w.buf[:0]
	}
	w.b = append(w.b, resetDuration(reset, now)...)
	w.add(key)
}

// minute reports the api_key minute budget: capacity, tokens left, Unix time when whole.
func (w *headerWriter) minute(s budget.Status) {
	w.int("X-Ratelimit-Tokens-Limit", s.Limit)
	w.int("X-Ratelimit-Tokens-Remaining", s.Remaining)
	w.int("X-Ratelimit-Tokens-Reset", unixCeil(s.Reset))
}

// day reports the api_key day budget.
func (w *headerWriter) day(s budget.Status) {
	w.int("X-Ratelimit-Tokens-Day-Limit", s.Limit)
	w.int("X-Ratelimit-Tokens-Day-Remaining", s.Remaining)
	w.int("X-Ratelimit-Tokens-Day-Reset", unixCeil(s.Reset))
}

func (w *headerWriter) openAITokens(s budget.Status, now time.Time) {
	w.int("X-Ratelimit-Limit-Tokens", s.Limit)
	w.int("X-Ratelimit-Remaining-Tokens", s.Remaining)
	w.duration("X-Ratelimit-Reset-Tokens", s.Reset, now)
}

func (w *headerWriter) flush(h http.Header) {
	if w.n == 0 {
		return
	}
	all := string(w.b)
	vals := make([]string, w.n)
	start := 0
	for i := 0; i < w.n; i++ {
		vals[i] = all[start:w.ends[i]]
		start = w.ends[i]
		h[w.keys[i]] = vals[i : i+1 : i+1]
	}
}

func unixCeil(t time.Time) int64 {
	s := t.Unix()
	if t.Nanosecond() > 0 {
		s++
	}
	return s
}

// resetDuration is OpenAI's spelling of a reset: a duration such as "1.5s" or "6m0s".
func resetDuration(reset, now time.Time) string {
	d := reset.Sub(now)
	if d <= 0 {
		return "0s"
	}
	return d.Round(time.Millisecond).String()
}
