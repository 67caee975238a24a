// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package config

import (
	"cmp"
	"strconv"
	"time"

	"github.com/tokenwarden/tokenwarden/proxy/attribute"
)

// ClassSettings are each priority class's own bounds (scheduling.classes).
type ClassSettings struct {
	Interactive ClassLimits `json:"interactive,omitzero"`
	Batch       ClassLimits `json:"batch,omitzero"`
	Background  ClassLimits `json:"background,omitzero"`
}

// ClassLimits bound the requests of one priority class.
type ClassLimits struct {
	// MaxQueueWaitSeconds bounds a wait of this class in an upstream's queue; the
	// request still queued then gets 429 queue_timeout (0 or absent:
	// scheduling.max_queue_wait_seconds).
	MaxQueueWaitSeconds int64 `json:"max_queue_wait_seconds,omitempty"`
	// MinSharePercent is the share, in percent, of the tokens an upstream dispatches
	// from its queue that batch or background keeps while it waits: once the classes
	// served before it took more than the rest, its next request goes first, so it is
	// never starved (0 or absent: 10 for batch, 5 for background; at most 50; not for
	// interactive, which is served first).
	MinSharePercent int64 `json:"min_share_percent,omitempty"`
	// MaxOutputTokens caps the output a request of this class may ask for
	// (max_tokens, max_completion_tokens or max_output_tokens), with or without an
	// upstream capacity (0 or absent: no cap).
	MaxOutputTokens int64 `json:"max_output_tokens,omitempty"`
	// OverMaxOutputTokens is what a request that asks for more than MaxOutputTokens
	// gets: clamp (absent) lowers its limit to the cap before it is estimated and
	// forwarded; refuse answers 400. A request that states no limit gets the cap.
	OverMaxOutputTokens OverAction `json:"over_max_output_tokens,omitempty"`
}

// OverAction is what the proxy does with a request beyond a class's max_output_tokens.
type OverAction string

// Actions on a request beyond a class's max_output_tokens.
const (
	OverClamp  OverAction = "clamp"
	OverRefuse OverAction = "refuse"
)

// Of returns the limits of the class named by a priority word (interactive, batch,
// background); any other word is interactive's.
func (cs *ClassSettings) Of(priority string) *ClassLimits {
	switch priority {
	case PriorityBatch:
		return &cs.Batch
	case PriorityBackground:
		return &cs.Background
	}
	return &cs.Interactive
}

// MaxQueueWait is the longest wait of the class in force, given scheduling's.
func (l *ClassLimits) MaxQueueWait(s *Scheduling) time.Duration {
	if l.MaxQueueWaitSeconds > 0 {
		return time.Duration(l.MaxQueueWaitSeconds) * time.Second
	}
	return s.MaxQueueWait()
}

// MinShare is the class's minimum share of an upstream's capacity in force, from 0 to
// 1, by the class's priority word (interactive: none).
func (cs *ClassSettings) MinShare(priority string) float64 {
	var p int64
	switch priority {
	case PriorityBatch:
		p = cmp.Or(cs.Batch.MinSharePercent, DefaultBatchMinSharePercent)
	case PriorityBackground:
		p = cmp.Or(cs.Background.MinSharePercent, DefaultBackgroundMinSharePercent)
	}
	return float64(p) / 100
}

// LongestQueueWait is the longest wait of any class: what a stopping proxy may have to
// serve before its queue is empty.
func (s *Scheduling) LongestQueueWait() time.Duration {
	w := s.MaxQueueWait()
	for _, p := range []string{PriorityInteractive, PriorityBatch, PriorityBackground} {
		w = max(w, s.Classes.Of(p).MaxQueueWait(s))
	}
	return w
}

// DefaultMaxQueueBytes is scheduling.max_queue_bytes's default: 256 MiB.
const DefaultMaxQueueBytes = 256 << 20

// QueueBytes is max_queue_bytes in force.
func (s *Scheduling) QueueBytes() int64 { return cmp.Or(s.MaxQueueBytes, DefaultMaxQueueBytes) }

// Agents bound the runs the proxy keeps for api_keys[].run_token_budget and
// run_max_steps.
type Agents struct {
	// MaxRuns bounds the runs kept at once, all keys together; when it is reached the
	// run idle longest is forgotten (0 or absent: 10000).
	MaxRuns int64 `json:"max_runs,omitempty"`
	// RunIdleSeconds forgets a run that sent nothing for this long; a request with its
	// run id then starts the run over (0 or absent: 900).
	RunIdleSeconds int64 `json:"run_idle_seconds,omitempty"`
}

// Agents defaults.
const (
	DefaultMaxRuns        = 10000
	DefaultRunIdleSeconds = 900
)

// RunHeader is the request header that names an agent's run; a run is its API key's
// own, so the same id under another key is another run (package attribute holds the
// client-supplied headers and their bounds).
const RunHeader = attribute.RunHeader

// MaxRunIDLength is the longest run id read; a longer one is refused.
const MaxRunIDLength = attribute.MaxLength

// Runs is max_runs in force.
func (a *Agents) Runs() int { return int(cmp.Or(a.MaxRuns, DefaultMaxRuns)) }

// RunIdle is run_idle_seconds in force.
func (a *Agents) RunIdle() time.Duration {
	return time.Duration(cmp.Or(a.RunIdleSeconds, DefaultRunIdleSeconds)) * time.Second
}

func (c *Config) validateAgents(errs *fieldErrors) {
	nonNegative(errs, "scheduling.max_queue_bytes", c.Scheduling.MaxQueueBytes)
	nonNegative(errs, "agents.max_runs", c.Agents.MaxRuns)
	nonNegative(errs, "agents.run_idle_seconds", c.Agents.RunIdleSeconds)
	for _, p := range []string{PriorityInteractive, PriorityBatch, PriorityBackground} {
		l := c.Scheduling.Classes.Of(p)
		f := "scheduling.classes." + p
		nonNegative(errs, f+".max_queue_wait_seconds", l.MaxQueueWaitSeconds)
		nonNegative(errs, f+".max_output_tokens", l.MaxOutputTokens)
		switch {
		case p == PriorityInteractive && l.MinSharePercent != 0:
			errs.add(f+".min_share_percent", "interactive is served first and has no minimum share; the share is for batch and background")
		case l.MinSharePercent < 0 || l.MinSharePercent > MaxMinSharePercent:
			errs.add(f+".min_share_percent", "must be from 0 to %d, got %d", MaxMinSharePercent, l.MinSharePercent)
		}
		switch l.OverMaxOutputTokens {
		case "", OverClamp, OverRefuse:
		default:
			errs.add(f+".over_max_output_tokens", "must be %q or %q, got %q", OverClamp, OverRefuse, l.OverMaxOutputTokens)
		}
	}
	for i := range c.APIKeys {
		k := &c.APIKeys[i]
		if k.MaxInFlight >= 0 && k.RunTokenBudget >= 0 && k.RunMaxSteps >= 0 {
			continue
		}
		f := "api_keys[" + strconv.Itoa(i) + "]"
		nonNegative(errs, f+".max_in_flight", k.MaxInFlight)
		nonNegative(errs, f+".run_token_budget", k.RunTokenBudget)
		nonNegative(errs, f+".run_max_steps", k.RunMaxSteps)
	}
}
