// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package health

import (
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/tokenwarden/tokenwarden/proxy/config"
)

// Source names where a cooldown's interval came from.
type Source string

// Sources, in the order they are read.
const (
	SourceRetryAfter   Source = "retry-after"
	SourceRetryAfterMs Source = "retry-after-ms"
	SourceOpenAIReset  Source = "x-ratelimit-reset"
	SourceAnthropic    Source = "anthropic-ratelimit-reset"
	SourceDefault      Source = "default"
	// SourceConfig: a billing cooldown's configured interval, longer than asked.
	SourceConfig Source = "billing_cooldown_seconds"
)

// Interval is a 429's cooldown: what the upstream asked for (Requested, 0 when it
// gave no timing), where it said so, and what applies once defaulted and capped.
type Interval struct {
	Requested time.Duration
	Applied   time.Duration
	Source    Source
	// Clamped is true when Requested was longer than config.MaxCooldown.
	Clamped bool
}

// CooldownFor reads a 429's timing from its headers, in this order:
// Retry-After (seconds or an HTTP date), then retry-after-ms, then the earliest
// OpenAI x-ratelimit-reset-* duration or Anthropic anthropic-ratelimit-*-reset
// timestamp still ahead, else config.DefaultCooldown; capped at config.MaxCooldown.
func CooldownFor(h http.Header, now time.Time) Interval {
	var iv Interval
	iv.Requested, iv.Source = asked(h, now)
	switch {
	case iv.Requested <= 0:
		// No timing, or a time already passed (a retry at once would be refused
		// again): the default.
		iv.Applied = config.DefaultCooldown
	case iv.Requested > config.MaxCooldown:
		iv.Applied, iv.Clamped = config.MaxCooldown, true
	default:
		iv.Applied = iv.Requested
	}
	return iv
}

// asked is the timing an answer's headers ask for, uncapped, and where it is read:
// 0 and SourceDefault when they give none.
func asked(h http.Header, now time.Time) (time.Duration, Source) {
	if d, ok := retryAfter(h.Get("Retry-After"), now); ok {
		return d, SourceRetryAfter
	}
	if d, ok := millis(h.Get("Retry-After-Ms")); ok {
		return d, SourceRetryAfterMs
	}
	if d, src, ok := resets(h, now); ok {
		return d, src
	}
	return 0, SourceDefault
}

func retryAfter(v string, now time.Time) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if s, err := strconv.ParseFloat(v, 64); err == nil {
		if s < 0 || s != s {
			return 0, false
		}
		return seconds(s), true
	}
	if t, err := http.ParseTime(v); err == nil {
		return t.Sub(now), true
	}
	return 0, false
}

func millis(v string) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	ms, err := strconv.ParseFloat(v, 64)
	if err != nil || ms < 0 || ms != ms {
		return 0, false
	}
	return seconds(ms / 1000), true
}

// seconds converts without overflow: anything beyond a day is a day (capped later).
func seconds(s float64) time.Duration {
	if s > 86400 {
		return 24 * time.Hour
	}
	return time.Duration(s * float64(time.Second))
}

// resets reads the earliest reset still ahead among the OpenAI and Anthropic
// rate-limit reset headers.
func resets(h http.Header, now time.Time) (time.Duration, Source, bool) {
	var best time.Duration
	var src Source
	found := false
	take := func(d time.Duration, s Source) {
		if d > 0 && (!found || d < best) {
			best, src, found = d, s, true
		}
	}
	for k, vs := range h {
		if len(vs) == 0 {
			continue
		}
		lk := strings.ToLower(k)
		switch {
		case strings.HasPrefix(lk, "x-ratelimit-reset"):
			if d, ok := openAIDuration(vs[0]); ok {
				take(d, SourceOpenAIReset)
			}
		case strings.HasPrefix(lk, "anthropic-ratelimit-") && strings.HasSuffix(lk, "-reset"):
			if t, err := time.Parse(time.RFC3339, strings.TrimSpace(vs[0])); err == nil {
				take(t.Sub(now), SourceAnthropic)
			}
		}
	}
	return best, src, found
}

// openAIDuration reads OpenAI's reset durations: "1s", "6m0s", "17ms", "1h2m3.5s",
// or a bare number of seconds.
func openAIDuration(v string) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if d, err := time.ParseDuration(v); err == nil {
		return d, d >= 0
	}
	if s, err := strconv.ParseFloat(v, 64); err == nil && s >= 0 {
		return seconds(s), true
	}
	return 0, false
}
