// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

// Package refusal writes the proxy's own answers in each API family's shape: the error
// bodies, the description of a budget's refusal, and the rate limit header families
// that report a caller's own budgets.
package refusal

import (
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
)

// Family is an API family: it decides the shape of error bodies and the upstream
// credential header.
type Family uint8

// API families.
const (
	OpenAI Family = iota
	Anthropic
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

// Body is what a refusal adds to an error body: the limit type and its details.
type Body struct {
	LimitType string
	Details   map[string]any
}

// Write answers status with a JSON error of code and msg in the family's shape, with
// the refusal's limit type and details when b is not nil.
func Write(w http.ResponseWriter, f Family, status int, code, msg string, b *Body) {
	var body any
	if f == Anthropic {
		var e anthropicError
		e.Type = "error"
		e.Error.Type = anthropicType(status)
		e.Error.Message = msg
		if b != nil {
			e.Error.LimitType, e.Error.Details = b.LimitType, b.Details
		}
		body = &e
	} else {
		var e openAIError
		e.Error.Message = msg
		e.Error.Type = openAIType(status)
		e.Error.Code = code
		if b != nil {
			e.Error.LimitType, e.Error.Details = b.LimitType, b.Details
		}
		body = &e
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(body)
}

// Why a refusal is final: the reasons in details.reason of a 429 that carries
// x-should-retry: false.
const (
	// reasonLargerThanBudget: the request is larger than the whole refusing bucket.
	reasonLargerThanBudget = "larger_than_budget"
	// reasonBeyondPatience: the wait is longer than the client's patience.
	reasonBeyondPatience = "beyond_patience"
)

// Request is what a budget's refusal tells of the request refused.
type Request struct {
	// Decision is admission's, with the caller's own bucket levels.
	Decision *budget.Decision
	Family   Family
	// Tokens is the request's reservation, Model its model.
	Tokens int64
	Model  string
	// Patience is the longest Retry-After a client is told to wait for
	// (rate_limiting.retry_patience_seconds).
	Patience time.Duration
	Now      time.Time
}

// Budget describes a budget's refusal of a 429: it sets on h the Retry-After from the
// refused request's own cost and the caller's own bucket levels, nothing about a shared
// bucket's level, and returns the message, the body and the Retry-After in seconds. A
// refusal that no wait within the client's patience cures (a request larger than its
// whole budget, or a Retry-After beyond the patience) also says x-should-retry: false,
// which the official SDKs obey by failing at once; Retry-After stays, as information.
func Budget(h http.Header, r *budget.Refusal, q *Request) (msg string, rb *Body, secs int64) {
	now := q.Now
	SetLimitHeaders(h, q.Decision, now, q.Family)
	secs = int64(math.Ceil(r.RetryAfter.Seconds()))
	if secs < 1 {
		secs = 1
	}
	h.Set("Retry-After", strconv.FormatInt(secs, 10))
	h.Set("Retry-After-Ms", strconv.FormatInt(max(r.RetryAfter.Milliseconds(), 1), 10))
	var reason string
	switch {
	case r.LargerThanBucket:
		reason = reasonLargerThanBudget
	case r.RetryAfter > q.Patience:
		reason = reasonBeyondPatience
	}
	if reason != "" {
		h.Set("X-Should-Retry", "false")
	}

	details := map[string]any{"retry_after_seconds": secs, "retryable": reason == ""}
	if reason != "" {
		details["reason"] = reason
	}
	rb = &Body{Details: details}
	switch {
	case r.Amount == budget.AmountInFlight && r.Rule != "":
		msg = inFlightRefusal(r, rb)
	case r.Rule != "":
		msg = ruleRefusal(h, r, rb, q.Model, secs)
	case r.Requests:
		rb.LimitType = "requests"
		details["dimension"] = r.Dimension.String()
		msg = fmt.Sprintf("request rate limit exceeded on the %s dimension; retry after %ds", r.Dimension, secs)
	default:
		rb.LimitType = "token_budget"
		details["token_dimension"] = r.Dimension.String()
		details["requested_tokens"] = q.Tokens
		if r.BothPeriods {
			details["token_budget"] = r.Period.String()
		}
		if r.Dimension == budget.Model {
			details["model"] = q.Model
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
			if q.Family == Anthropic {
				hw.anthropic(&anthropicTokens, r.Bucket)
			}
			hw.flush(h)
		}
		if r.LargerThanBucket {
			var whole string
			if r.Bucket.Present {
				whole = fmt.Sprintf(" (%d tokens)", r.Bucket.Limit)
			}
			msg = fmt.Sprintf("this request reserves %d tokens, more than the whole %s budget of the %s dimension holds%s: no wait lets it in, so do not retry it; send a smaller request (a lower max_tokens or a shorter input)",
				q.Tokens, r.Period, r.Dimension, whole)
		} else {
			msg = fmt.Sprintf("token budget exceeded on the %s dimension (%s budget): this request reserves %d tokens; retry after %ds",
				r.Dimension, r.Period, q.Tokens, secs)
		}
	}
	if reason == reasonBeyondPatience {
		msg += fmt.Sprintf(", longer than this proxy's retry patience of %ds, so do not retry it now", int64(q.Patience/time.Second))
	}
	return msg, rb, secs
}

// ruleRefusal describes a refusal by a rule's window: its dimension, window and
// amount, and, for the caller's own rule (api_key, or counted by api_key), its name
// and level. A shared rule's name and level are never told. model is the request's.
func ruleRefusal(h http.Header, r *budget.Refusal, rb *Body, model string, secs int64) string {
	d := rb.Details
	d["dimension"] = r.Dimension.String()
	d["window"] = r.Window
	d["amount"] = r.Amount.String()
	unit := r.Amount.String()
	asked := strconv.FormatFloat(r.Asked, 'f', -1, 64)
	switch r.Amount {
	case budget.AmountRequests:
		rb.LimitType = "requests"
	case budget.AmountCost:
		rb.LimitType = "cost_budget"
		unit, asked = "US dollars", dollarString(r.Asked)
		d["requested_dollars"] = r.Asked
	default:
		rb.LimitType = "token_budget"
		d["requested_tokens"] = int64(r.Asked)
	}
	if r.Dimension == budget.Model {
		d["model"] = model
	}
	what := fmt.Sprintf("a budget of the %s dimension (%s window)", r.Dimension, r.Window)
	if r.Scoped {
		d["rule"] = r.Rule
		what = fmt.Sprintf("your budget %q (%s window)", r.Rule, r.Window)
		var hw headerWriter
		switch {
		case r.Cost.Present:
			d["limit_dollars"], d["remaining_dollars"] = r.Cost.Limit, r.Cost.Remaining
			hw.cost(r.Cost)
		case r.Bucket.Present:
			d["capacity"], d["remaining"] = r.Bucket.Limit, r.Bucket.Remaining
			switch r.Amount {
			case budget.AmountInput:
				hw.family(&inputTokens, r.Bucket)
			case budget.AmountOutput:
				hw.family(&outputTokens, r.Bucket)
			}
		}
		hw.flush(h)
	}
	if r.LargerThanBucket {
		return fmt.Sprintf("this request reserves %s %s, more than the whole of %s: no wait lets it in, so do not retry it; send a smaller request", asked, unit, what)
	}
	if r.Period == budget.Calendar {
		return fmt.Sprintf("%s is spent until the window resets: this request reserves %s %s; retry after %ds", what, asked, unit, secs)
	}
	return fmt.Sprintf("%s exceeded: this request reserves %s %s; retry after %ds", what, asked, unit, secs)
}

// inFlightRefusal describes a refusal by a rule's in-flight limit: its dimension
// and, for the caller's own rule, its name and limit.
func inFlightRefusal(r *budget.Refusal, rb *Body) string {
	d := rb.Details
	rb.LimitType = "in_flight"
	d["dimension"], d["window"], d["amount"] = r.Dimension.String(), r.Window, r.Amount.String()
	if r.Scoped {
		d["rule"], d["max_in_flight"] = r.Rule, r.Bucket.Limit
		return fmt.Sprintf("your budget %q allows %d requests in flight, and that many are; retry when one ends", r.Rule, r.Bucket.Limit)
	}
	return fmt.Sprintf("a budget of the %s dimension allows no more requests in flight now; retry when one ends", r.Dimension)
}

// dollarString formats US dollars to the micro-dollar.
func dollarString(v float64) string {
	return strconv.FormatFloat(math.Round(v*1e6)/1e6, 'f', -1, 64)
}
