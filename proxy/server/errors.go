// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package server

import (
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
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
	if refusal != nil {
		ex.countRefusal(code, refusal.limitType)
	}
	ex.rec.errCode, ex.rec.errMsg = code, msg
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

// Why a refusal is final: the reasons in details.reason of a 429 that carries
// x-should-retry: false.
const (
	// reasonLargerThanBudget: the request is larger than the whole refusing bucket.
	reasonLargerThanBudget = "larger_than_budget"
	// reasonBeyondPatience: the wait is longer than rate_limiting.retry_patience_seconds.
	reasonBeyondPatience = "beyond_patience"
)

// refuse answers 429 for a refusal: Retry-After from the refused request's own cost,
// the caller's own bucket levels, and nothing about a shared bucket's level. A refusal
// that no wait within the client's patience cures (a request larger than its whole
// budget, or a Retry-After beyond rate_limiting.retry_patience_seconds) also says
// x-should-retry: false, which the official SDKs obey by failing at once; Retry-After
// stays, as information.
func (ex *exchange) refuse(w http.ResponseWriter, r *budget.Refusal) {
	h := w.Header()
	now := ex.s.clock.Now()
	setLimitHeaders(h, &ex.dec, now, ex.route.family)
	secs := int64(math.Ceil(r.RetryAfter.Seconds()))
	if secs < 1 {
		secs = 1
	}
	ex.rec.retryAfterSecond = secs
	h.Set("Retry-After", strconv.FormatInt(secs, 10))
	h.Set("Retry-After-Ms", strconv.FormatInt(max(r.RetryAfter.Milliseconds(), 1), 10))
	var reason string
	switch {
	case r.LargerThanBucket:
		reason = reasonLargerThanBudget
	case r.RetryAfter > ex.rt.retryPatience:
		reason = reasonBeyondPatience
	}
	if reason != "" {
		h.Set("X-Should-Retry", "false")
	}

	details := map[string]any{"retry_after_seconds": secs, "retryable": reason == ""}
	if reason != "" {
		details["reason"] = reason
	}
	rb := &refusalBody{details: details}
	var msg string
	switch {
	case r.Rule != "":
		msg = ex.ruleRefusal(h, r, rb, secs)
	case r.Requests:
		rb.limitType = "requests"
		details["dimension"] = r.Dimension.String()
		msg = fmt.Sprintf("request rate limit exceeded on the %s dimension; retry after %ds", r.Dimension, secs)
	default:
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
			if ex.route.family == Anthropic {
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
				ex.est.Total(), r.Period, r.Dimension, whole)
		} else {
			msg = fmt.Sprintf("token budget exceeded on the %s dimension (%s budget): this request reserves %d tokens; retry after %ds",
				r.Dimension, r.Period, ex.est.Total(), secs)
		}
	}
	if reason == reasonBeyondPatience {
		msg += fmt.Sprintf(", longer than this proxy's retry patience of %ds, so do not retry it now", int64(ex.rt.retryPatience/time.Second))
	}
	ex.fail(w, http.StatusTooManyRequests, "rate_limit_exceeded", msg, rb)
}

// ruleRefusal describes a refusal by a rule's window: its dimension, window and
// amount, and, for the caller's own rule (api_key, or counted by api_key), its name
// and level. A shared rule's name and level are never told.
func (ex *exchange) ruleRefusal(h http.Header, r *budget.Refusal, rb *refusalBody, secs int64) string {
	d := rb.details
	d["dimension"] = r.Dimension.String()
	d["window"] = r.Window
	d["amount"] = r.Amount.String()
	unit := r.Amount.String()
	asked := strconv.FormatFloat(r.Asked, 'f', -1, 64)
	switch r.Amount {
	case budget.AmountRequests:
		rb.limitType = "requests"
	case budget.AmountCost:
		rb.limitType = "cost_budget"
		unit, asked = "US dollars", dollarString(r.Asked)
		d["requested_dollars"] = r.Asked
	default:
		rb.limitType = "token_budget"
		d["requested_tokens"] = int64(r.Asked)
	}
	if r.Dimension == budget.Model {
		d["model"] = ex.est.Model
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

// dollarString formats US dollars to the micro-dollar.
func dollarString(v float64) string {
	return strconv.FormatFloat(math.Round(v*1e6)/1e6, 'f', -1, 64)
}

// setLimitHeaders reports the caller's own buckets: its api_key token budgets (the
// x-ratelimit-tokens-* families and OpenAI's names for the minute budget) and
// its request-count quota; on an Anthropic route, the same budgets under Anthropic's
// names too (tokens: the minute budget, or the day budget when the key has no minute
// one). Shared dimensions are never reported. On an upstream's answer, h is the
// client's header: set there, these headers are not copied with an allocation each,
// and the upstream's of the same names are gone (stripUpstreamLimits), so the client
// gets one value of each.
func setLimitHeaders(h http.Header, d *budget.Decision, now time.Time, family Family) {
	var hw headerWriter
	if d.KeyMinute.Present {
		hw.minute(d.KeyMinute)
		hw.openAITokens(d.KeyMinute, now)
	}
	if d.KeyDay.Present {
		hw.day(d.KeyDay)
	}
	s := d.KeyRequests
	if s.Present {
		hw.int("X-Ratelimit-Limit", s.Limit)
		hw.int("X-Ratelimit-Remaining", s.Remaining)
		hw.int("X-Ratelimit-Reset", unixCeil(s.Reset))
		hw.int("X-Ratelimit-Limit-Requests", s.Limit)
		hw.int("X-Ratelimit-Remaining-Requests", s.Remaining)
		hw.duration("X-Ratelimit-Reset-Requests", s.Reset, now)
	}
	if d.KeyInput.Present {
		hw.family(&inputTokens, d.KeyInput)
	}
	if d.KeyOutput.Present {
		hw.family(&outputTokens, d.KeyOutput)
	}
	if d.KeyCost.Present {
		hw.cost(d.KeyCost)
	}
	if family == Anthropic {
		switch {
		case d.KeyMinute.Present:
			hw.anthropic(&anthropicTokens, d.KeyMinute)
		case d.KeyDay.Present:
			hw.anthropic(&anthropicTokens, d.KeyDay)
		}
		if s.Present {
			hw.anthropic(&anthropicRequests, s)
		}
		if d.KeyInput.Present {
			hw.anthropic(&anthropicInput, d.KeyInput)
		}
		if d.KeyOutput.Present {
			hw.anthropic(&anthropicOutput, d.KeyOutput)
		}
	}
	hw.flush(h)
	if len(d.Warnings) > 0 {
		h.Set(budgetWarningHeader, warningValue(d.Warnings))
	}
}

// budgetWarningHeader names the warn rules' windows a request did not fit.
const budgetWarningHeader = "X-Tokenwarden-Budget-Warning"

// warningValue is the warning header's value: RULE;window=WINDOW for each window the
// request did not fit, joined by ", ".
func warningValue(ws []budget.Warning) string {
	var b strings.Builder
	for i, w := range ws {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(w.Rule)
		b.WriteString(";window=")
		b.WriteString(w.Window)
	}
	return b.String()
}

// family reports a bucket under one of this proxy's header families (limit,
// remaining, reset as a Unix time).
func (w *headerWriter) family(names *[3]string, s budget.Status) {
	w.int(names[0], s.Limit)
	w.int(names[1], s.Remaining)
	w.int(names[2], unixCeil(s.Reset))
}

// cost reports the caller's tightest cost budget in US dollars.
func (w *headerWriter) cost(d budget.Dollars) {
	for i, v := range [2]float64{d.Limit, d.Remaining} {
		var tmp [32]byte
		w.value(costHeaders[i], strconv.AppendFloat(tmp[:0], math.Round(v*1e6)/1e6, 'f', -1, 64))
	}
	w.int(costHeaders[2], unixCeil(d.Reset))
}

// This proxy's header families for the input_tokens, output_tokens and cost amounts.
var (
	inputTokens  = [3]string{"X-Ratelimit-Input-Tokens-Limit", "X-Ratelimit-Input-Tokens-Remaining", "X-Ratelimit-Input-Tokens-Reset"}
	outputTokens = [3]string{"X-Ratelimit-Output-Tokens-Limit", "X-Ratelimit-Output-Tokens-Remaining", "X-Ratelimit-Output-Tokens-Reset"}
	costHeaders  = [3]string{"X-Tokenwarden-Budget-Cost-Limit", "X-Tokenwarden-Budget-Cost-Remaining", "X-Tokenwarden-Budget-Cost-Reset"}
)

// headerWriter sets a batch of headers with two allocations: every value is formatted
// into one buffer that becomes one string, and the value slices share one backing
// array. The rate limit headers are on every answer, so this is the hot path. The
// writer stays on its caller's stack: values are copied into buf, never appended to a
// slice of it (which would move the writer to the heap), and go on to over only when
// buf is full.
type headerWriter struct {
	keys [40]string
	ends [40]int
	n    int
	used int
	buf  [1024]byte
	over []byte
}

// value adds one header with its formatted value.
func (w *headerWriter) value(key string, v []byte) {
	if w.over == nil && w.used+len(v) <= len(w.buf) {
		w.used += copy(w.buf[w.used:], v)
	} else {
		if w.over == nil {
			w.over = append(make([]byte, 0, 2*len(w.buf)), w.buf[:w.used]...)
		}
		w.over = append(w.over, v...)
		w.used = len(w.over)
	}
	w.keys[w.n], w.ends[w.n] = key, w.used
	w.n++
}

// values is every value formatted so far, end to end.
func (w *headerWriter) values() []byte {
	if w.over != nil {
		return w.over
	}
	return w.buf[:w.used]
}

func (w *headerWriter) int(key string, v int64) {
	var tmp [24]byte
	w.value(key, strconv.AppendInt(tmp[:0], v, 10))
}

func (w *headerWriter) duration(key string, reset, now time.Time) {
	var tmp [32]byte
	w.value(key, append(tmp[:0], resetDuration(reset, now)...))
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

// anthropic reports a bucket under one of Anthropic's header families (limit,
// remaining, reset), the reset as an RFC 3339 time in UTC, to the second.
func (w *headerWriter) anthropic(names *[3]string, s budget.Status) {
	w.int(names[0], s.Limit)
	w.int(names[1], s.Remaining)
	var tmp [32]byte
	w.value(names[2], time.Unix(unixCeil(s.Reset), 0).UTC().AppendFormat(tmp[:0], time.RFC3339))
}

// Anthropic's header families, as canonical keys.
var (
	anthropicTokens   = [3]string{"Anthropic-Ratelimit-Tokens-Limit", "Anthropic-Ratelimit-Tokens-Remaining", "Anthropic-Ratelimit-Tokens-Reset"}
	anthropicRequests = [3]string{"Anthropic-Ratelimit-Requests-Limit", "Anthropic-Ratelimit-Requests-Remaining", "Anthropic-Ratelimit-Requests-Reset"}
	anthropicInput    = [3]string{"Anthropic-Ratelimit-Input-Tokens-Limit", "Anthropic-Ratelimit-Input-Tokens-Remaining", "Anthropic-Ratelimit-Input-Tokens-Reset"}
	anthropicOutput   = [3]string{"Anthropic-Ratelimit-Output-Tokens-Limit", "Anthropic-Ratelimit-Output-Tokens-Remaining", "Anthropic-Ratelimit-Output-Tokens-Reset"}
)

func (w *headerWriter) openAITokens(s budget.Status, now time.Time) {
	w.int("X-Ratelimit-Limit-Tokens", s.Limit)
	w.int("X-Ratelimit-Remaining-Tokens", s.Remaining)
	w.duration("X-Ratelimit-Reset-Tokens", s.Reset, now)
}

// flush sets every header on h.
func (w *headerWriter) flush(h http.Header) {
	if w.n == 0 {
		return
	}
	all := string(w.values())
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
