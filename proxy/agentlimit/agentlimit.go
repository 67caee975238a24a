// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

// Package agentlimit holds the limits for agents: a key's requests in flight, its runs' tokens and steps, and each class's output cap with the body rewrite it makes.
package agentlimit

import (
	"net/http"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/tokenwarden/tokenwarden/proxy/attribute"
	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/proxy/config"
	"github.com/tokenwarden/tokenwarden/proxy/schedule"
)

// Refusal codes of the limits for agents (docs/scheduling.md "Limits for agents").
const (
	codeInFlight   = "in_flight_limit"
	codeRunBudget  = "run_budget_exceeded"
	codeRunSteps   = "run_steps_exceeded"
	codeMaxTokens  = "max_tokens_above_class_cap"
	codeBadRunID   = "invalid_run_id"
	limitInFlight  = "in_flight"
	limitRun       = "run"
	limitMaxTokens = "max_output_tokens"
)

// Key is an API key's limits for agents; 0 is none.
type Key struct {
	MaxInFlight, RunTokens, RunSteps int64
}

// Refusal is a request the limits for agents refuse: the answer's status, code,
// message, limit type and details, and a header it carries.
type Refusal struct {
	Status                   int
	Code, LimitType, Message string
	Details                  map[string]any
	Header, Value            string
}

// refuse is the refusal of a request of class, its details with the class and the code
// again (for the Anthropic shape, which has no code field).
func refuse(class schedule.Class, status int, code, limitType, msg string, details map[string]any) *Refusal {
	if details == nil {
		details = map[string]any{}
	}
	details["class"] = class.String()
	details["reason"] = code
	return &Refusal{Status: status, Code: code, LimitType: limitType, Message: msg, Details: details}
}

// Limits is the state of the limits for agents, kept across reloads: each key's
// requests in flight, and the runs.
type Limits struct {
	// inFlight holds an *atomic.Int64 per key name with a max_in_flight.
	inFlight sync.Map
	runs     runTable
	// fleet, when set, keeps the limits as the fleet's totals (fleet.go).
	fleet Fleet
}

// Configure applies the config's bounds on the runs kept.
func (l *Limits) Configure(cfg *config.Config) {
	l.runs.configure(cfg.Agents.Runs(), cfg.Agents.RunIdle())
}

// Runs returns the number of runs kept.
func (l *Limits) Runs() int {
	l.runs.mu.Lock()
	defer l.runs.mu.Unlock()
	return l.runs.lru.Len()
}

// Request is one request's part in the limits for agents.
type Request struct {
	// Class is the request's priority class: its key's, lowered by the header.
	Class schedule.Class
	// Answered says the request is answered without a generation (a cache hit): it
	// takes no slot of the key's requests in flight, while its run counts its step.
	Answered bool
	// inFlight is the key's counter the request counts in, until it ends.
	inFlight *atomic.Int64
	// run is the request's run and held what the request reserved of it, until the
	// request settles or is released.
	run  *run
	held int64
	// shared is the request's hold of the fleet's totals, until it ends.
	shared *fleetState
}

// ClassOf is a request's priority class: keyClass, lowered by the
// x-tokenwarden-priority header and never raised.
func ClassOf(h http.Header, keyClass schedule.Class) schedule.Class {
	c := keyClass
	if v := h.Get(config.PriorityHeader); v != "" {
		if asked, ok := schedule.ParseClass(strings.ToLower(strings.TrimSpace(v))); ok {
			c = schedule.Lower(c, asked)
		}
	}
	return c
}

// Admit counts the request of the API key name, whose limits are k, in the key's
// requests in flight and in the run its header names, reserving cost tokens of the
// run; it returns the refusal when a limit does not allow it. With a Fleet they are
// the fleet's totals; while its store cannot decide, and without one, this replica's.
func (l *Limits) Admit(req *Request, clock budget.Clock, h http.Header, name string, k Key, cost int64) *Refusal {
	var id string
	if k.RunTokens != 0 || k.RunSteps != 0 {
		v, err := attribute.Read(h, attribute.Run)
		if err != nil {
			// The run id obeys every attribute header's bounds: 1 to 256 visible ASCII
			// bytes, sent once.
			return refuse(req.Class, http.StatusBadRequest, codeBadRunID, limitRun, err.Error(), nil)
		}
		id = v
	}
	if l.fleet != nil {
		if ref, ok := l.admitFleet(req, name, id, k, cost); ok {
			return ref
		}
	}
	if k.MaxInFlight > 0 && !req.Answered {
		v, ok := l.inFlight.Load(name)
		if !ok {
			v, _ = l.inFlight.LoadOrStore(name, new(atomic.Int64))
		}
		c := v.(*atomic.Int64)
		if c.Add(1) > k.MaxInFlight {
			c.Add(-1)
			return inFlightRefusal(req, name, k)
		}
		req.inFlight = c
	}
	if id == "" {
		return nil
	}
	rn, st := l.runs.take(clock.Now(), runKey{key: name, id: id}, k, cost)
	if rn != nil {
		req.run, req.held = rn, cost
		return nil
	}
	return runRefusal(req, name, k, cost, st, st.steps >= k.RunSteps && k.RunSteps > 0)
}

// End ends the request's part in the limits for agents when its handler returns.
func (l *Limits) End(req *Request) {
	if c := req.inFlight; c != nil {
		req.inFlight = nil
		c.Add(-1)
	}
	endFleet(req)
	l.Release(req)
}

// Settle counts what the request used in its run in place of its reservation.
func (l *Limits) Settle(req *Request, used int64) {
	if st := req.shared; st != nil && !st.settled {
		st.used, st.settled = used, true
	}
	if rn := req.run; rn != nil {
		req.run = nil
		l.runs.settle(rn, req.held, used, false)
	}
}

// Release gives the request's reservation and step back to its run: it ran nothing.
func (l *Limits) Release(req *Request) {
	if st := req.shared; st != nil && !st.settled {
		st.settled, st.released = true, true
	}
	if rn := req.run; rn != nil {
		req.run = nil
		l.runs.settle(rn, req.held, 0, true)
	}
}
