// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package agentlimit

import (
	"fmt"
	"net/http"
	"time"
)

// Fleet keeps the limits for agents as the fleet's totals, in a store every replica
// shares (proxy/agentlimit/redisagents); without one each replica keeps its own.
type Fleet interface {
	// Take counts a request as a.Slot and a.Run ask, all or nothing, and returns
	// its hold; a refused request takes nothing. An error means the store could not
	// decide (the replica's own counts decide then).
	Take(a *FleetAsk) (FleetHold, FleetVerdict, error)
}

// FleetAsk is what one request takes of its API key's fleet-wide limits.
type FleetAsk struct {
	// Key is the API key's name.
	Key string
	// MaxInFlight, above 0, takes one of the key's slots in flight.
	MaxInFlight int64
	// Run, when set, counts one step and Cost tokens in the key's run of that id,
	// within RunSteps and RunTokens (0: no bound); a run idle for RunIdle is forgotten.
	Run                       string
	RunSteps, RunTokens, Cost int64
	RunIdle                   time.Duration
}

// FleetVerdict is a Take's answer: Refused names the limit that refused (none:
// admitted), and Steps and Spent the run's steps and tokens (spent and still
// reserved) when a run limit refused.
type FleetVerdict struct {
	Refused      FleetLimit
	Steps, Spent int64
}

// FleetLimit is the limit of a Fleet's refusal.
type FleetLimit uint8

// The limits a Fleet refuses by.
const (
	FleetAdmitted FleetLimit = iota
	FleetInFlight
	FleetRunSteps
	FleetRunTokens
)

// FleetHold is what an admitted request holds of the fleet's limits. End gives its
// slot back, and corrects its run's reservation to used; released, it ran nothing
// and its step is given back too. End is called once, when the request's handler
// returns.
type FleetHold interface {
	End(used int64, released bool)
}

// fleetState is what a request holding a fleet's hold has learned since its Take.
type fleetState struct {
	hold FleetHold
	used int64
	// settled is set once the request settled (used is what it used) or released.
	settled, released bool
}

// SetFleet makes f keep the limits for agents as the fleet's totals; nil keeps them
// in this replica's memory.
func (l *Limits) SetFleet(f Fleet) { l.fleet = f }

// Shared reports whether the limits for agents are the fleet's totals.
func (l *Limits) Shared() bool { return l.fleet != nil }

// admitFleet counts the request in the fleet's totals. ok false: the fleet's store
// could not decide, and the replica's own counts do.
func (l *Limits) admitFleet(req *Request, name, run string, k Key, cost int64) (ref *Refusal, ok bool) {
	a := FleetAsk{Key: name, Run: run, RunSteps: k.RunSteps, RunTokens: k.RunTokens, Cost: cost, RunIdle: l.runs.idleTime()}
	if k.MaxInFlight > 0 && !req.Answered {
		a.MaxInFlight = k.MaxInFlight
	}
	if a.MaxInFlight == 0 && run == "" {
		return nil, true
	}
	hold, v, err := l.fleet.Take(&a)
	if err != nil {
		return nil, false
	}
	switch v.Refused {
	case FleetAdmitted:
		req.shared = &fleetState{hold: hold}
		return nil, true
	case FleetInFlight:
		return inFlightRefusal(req, name, k), true
	}
	return runRefusal(req, name, k, cost, runStats{spent: v.Spent, steps: v.Steps}, v.Refused == FleetRunSteps), true
}

// inFlightRefusal is the refusal of a request beyond its key's requests in flight.
func inFlightRefusal(req *Request, name string, k Key) *Refusal {
	ref := refuse(req.Class, http.StatusTooManyRequests, codeInFlight, limitInFlight,
		fmt.Sprintf("the API key %s has %d requests in flight, its limit; retry when one ends", name, k.MaxInFlight),
		map[string]any{"max_in_flight": k.MaxInFlight, "retryable": true, "retry_after_seconds": 1})
	ref.Header, ref.Value = "Retry-After", "1"
	return ref
}

// runRefusal is the refusal of a request its run's steps (steps) or tokens do not
// allow; st is the run's state.
func runRefusal(req *Request, name string, k Key, cost int64, st runStats, steps bool) *Refusal {
	var ref *Refusal
	if steps {
		ref = refuse(req.Class, http.StatusTooManyRequests, codeRunSteps, limitRun,
			fmt.Sprintf("the run has sent %d requests, the API key %s's limit per run; end the run or start another", st.steps, name),
			map[string]any{"run_max_steps": k.RunSteps, "run_steps": st.steps, "retryable": false})
	} else {
		ref = refuse(req.Class, http.StatusTooManyRequests, codeRunBudget, limitRun,
			fmt.Sprintf("this request reserves %d tokens and the run has %d of the API key %s's %d tokens per run left; end the run or send a smaller request",
				cost, max(k.RunTokens-st.spent, 0), name, k.RunTokens),
			map[string]any{"run_token_budget": k.RunTokens, "run_tokens_spent": st.spent, "requested_tokens": cost, "retryable": false})
	}
	ref.Header, ref.Value = "X-Should-Retry", "false"
	return ref
}

// endFleet ends the request's fleet hold, once, with what it settled (released if it
// never settled).
func endFleet(req *Request) {
	st := req.shared
	if st == nil {
		return
	}
	req.shared = nil
	st.hold.End(st.used, st.released || !st.settled)
}
