// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package refusal

import (
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
)

// SetLimitHeaders reports the caller's own buckets: its api_key token budgets (the
// x-ratelimit-tokens-* families and OpenAI's names for the minute budget) and
// its request-count quota; on an Anthropic route, the same budgets under Anthropic's
// names too (tokens: the minute budget, or the day budget when the key has no minute
// one). Shared dimensions are never reported. On an upstream's answer, h is the
// client's header: set there, these headers are not copied with an allocation each,
// and the upstream's of the same names are gone (StripUpstreamLimits), so the client
// gets one value of each.
func SetLimitHeaders(h http.Header, d *budget.Decision, now time.Time, family Family) {
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

// StripUpstreamLimits removes the upstream's rate limit headers (x-ratelimit-*,
// anthropic-ratelimit-*, the IETF RateLimit fields): they describe the provider
// account, not the tenant, and only this proxy's own headers describe budgets. A
// successful answer loses Retry-After and retry-after-ms too; a failed one (an upstream
// 429 or 503) keeps them, because they tell the client when the upstream will take the
// request again.
func StripUpstreamLimits(h http.Header, success bool) {
	for k := range h {
		if hasPrefixFold(k, "x-ratelimit") || hasPrefixFold(k, "anthropic-ratelimit") || hasPrefixFold(k, "ratelimit") ||
			// An upstream that is itself a tokenwarden speaks of its own fleet's rules,
			// upstreams and request ids; only this proxy speaks them to its client.
			hasPrefixFold(k, "x-tokenwarden-") ||
			success && (strings.EqualFold(k, "retry-after") || strings.EqualFold(k, "retry-after-ms")) {
			delete(h, k)
		}
	}
}

func hasPrefixFold(s, prefix string) bool {
	return len(s) >= len(prefix) && strings.EqualFold(s[:len(prefix)], prefix)
}
