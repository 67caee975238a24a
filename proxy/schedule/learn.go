// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package schedule

import (
	"math"
	"net/http"
	"time"
)

// Learn makes the in-flight request bound a learned one, by additive increase and
// multiplicative decrease (AIMD, as TCP's congestion window): the bound starts at
// Options.MaxInFlightRequests, which is also its ceiling; an answer that says the
// backend is overloaded (a 429, or response headers later than LatencyThreshold after
// dispatch) multiplies it by Decrease, at most once per Cooldown; every other answer
// adds 1/bound, so a full bound's worth of good answers adds one request. It never
// goes below MinInFlightRequests.
type Learn struct {
	// MinInFlightRequests is the floor (default 1).
	MinInFlightRequests int64
	// Decrease is the factor an overload multiplies the bound by, in (0, 1) (default 0.5).
	Decrease float64
	// LatencyThreshold, when positive, counts an answer whose headers came later than
	// this after dispatch as an overload.
	LatencyThreshold time.Duration
	// Cooldown is the least time between two decreases, so that the answers of
	// requests dispatched before a decrease do not decrease the bound again (default 1 s).
	Cooldown time.Duration
}

// Learn defaults.
const (
	DefaultLearnDecrease = 0.5
	DefaultLearnCooldown = time.Second
)

func (l *Learn) floor() float64 { return float64(max(1, l.MinInFlightRequests)) }

func (l *Learn) decrease() float64 {
	if l.Decrease <= 0 || l.Decrease >= 1 {
		return DefaultLearnDecrease
	}
	return l.Decrease
}

func (l *Learn) cooldown() time.Duration {
	if l.Cooldown <= 0 {
		return DefaultLearnCooldown
	}
	return l.Cooldown
}

// clampLearned keeps the learned bound within the learn options' floor and the
// configured ceiling; a scheduler that does not learn has none.
func (s *Scheduler) clampLearned() {
	l := s.o.Learn
	if l == nil || s.o.MaxInFlightRequests <= 0 {
		s.learned = 0
		return
	}
	ceiling := float64(s.o.MaxInFlightRequests)
	if s.learned == 0 {
		s.learned = ceiling
	}
	s.learned = math.Min(ceiling, math.Max(math.Min(l.floor(), ceiling), s.learned))
}

// maxInFlight is the in-flight request bound in force: the learned one when learning.
func (s *Scheduler) maxInFlight() int64 {
	if s.learned > 0 {
		return int64(s.learned)
	}
	return s.o.MaxInFlightRequests
}

// Answered tells the scheduler how the upstream answered the slot's request: its
// status, when its response headers arrived. A scheduler that learns its bound
// lowers it on an overload and raises it on any other answer; one that does not
// ignores it. Only the first call of a slot counts.
func (sl *Slot) Answered(status int) {
	s := sl.s
	if s == nil || sl.answered || s.o.Learn == nil {
		return
	}
	sl.answered = true
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.learned == 0 {
		return
	}
	l := s.o.Learn
	now := s.o.Now()
	overload := status == http.StatusTooManyRequests ||
		l.LatencyThreshold > 0 && now.Sub(sl.at) > l.LatencyThreshold
	if overload {
		if !s.lastDecrease.IsZero() && now.Sub(s.lastDecrease) < l.cooldown() {
			return
		}
		s.lastDecrease = now
		s.learned *= l.decrease()
		s.clampLearned()
		return
	}
	s.learned += 1 / s.learned
	s.clampLearned()
	s.dispatchLocked()
}

// Learned returns the in-flight request bound in force (the configured one when the
// scheduler does not learn).
func (s *Scheduler) Learned() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.maxInFlight()
}
