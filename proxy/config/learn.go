// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package config

import "time"

// LearnCapacity makes an upstream's in-flight request bound a learned one
// (upstreams[].capacity.learn, docs/scheduling.md "Learned capacity"): it starts at
// max_in_flight_requests, its ceiling; a 429 from the upstream, or response headers
// later than latency_threshold_ms after dispatch, multiplies it by decrease (at most
// once per cooldown_ms); every other answer adds 1/bound, one request per bound's
// worth of good answers; it never goes below min_in_flight_requests.
type LearnCapacity struct {
	// MinInFlightRequests is the floor of the learned bound (0 or absent: 1).
	MinInFlightRequests int64 `json:"min_in_flight_requests,omitempty"`
	// Decrease is what an overload multiplies the bound by, between 0 and 1 exclusive
	// (0 or absent: 0.5).
	Decrease float64 `json:"decrease,omitempty"`
	// LatencyThresholdMillis, when set, counts an answer whose headers came later
	// than this many milliseconds after dispatch as an overload (0 or absent: only
	// 429s count).
	LatencyThresholdMillis int64 `json:"latency_threshold_ms,omitempty"`
	// CooldownMillis is the least time between two decreases (0 or absent: 1000).
	CooldownMillis int64 `json:"cooldown_ms,omitempty"`
}

// LatencyThreshold is latency_threshold_ms as a duration.
func (l *LearnCapacity) LatencyThreshold() time.Duration {
	return time.Duration(l.LatencyThresholdMillis) * time.Millisecond
}

// Cooldown is cooldown_ms as a duration (0: the scheduler's default).
func (l *LearnCapacity) Cooldown() time.Duration {
	return time.Duration(l.CooldownMillis) * time.Millisecond
}

// validateLearn checks an upstream's capacity.learn; field is the capacity's path.
func validateLearn(errs *fieldErrors, field string, c *Capacity) {
	l := c.Learn
	if l == nil {
		return
	}
	f := field + ".learn"
	if c.MaxInFlightRequests <= 0 {
		errs.add(f, "needs %s.max_in_flight_requests, the bound it starts from and never exceeds", field)
	}
	nonNegative(errs, f+".min_in_flight_requests", l.MinInFlightRequests)
	if c.MaxInFlightRequests > 0 && l.MinInFlightRequests > c.MaxInFlightRequests {
		errs.add(f+".min_in_flight_requests", "must not exceed max_in_flight_requests (%d), got %d", c.MaxInFlightRequests, l.MinInFlightRequests)
	}
	if l.Decrease < 0 || l.Decrease >= 1 {
		errs.add(f+".decrease", "must be between 0 and 1 (exclusive), got %v", l.Decrease)
	}
	nonNegative(errs, f+".latency_threshold_ms", l.LatencyThresholdMillis)
	nonNegative(errs, f+".cooldown_ms", l.CooldownMillis)
}
