// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

// Package agentlimit holds the limits for agents: a key's requests in flight, its runs' tokens and steps, and each class's output cap with the body rewrite it makes.
package agentlimit

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"

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
// run; it returns the refusal when a limit does not allow it.
func (l *Limits) Admit(req *Request, clock budget.Clock, h http.Header, name string, k Key, cost int64) *Refusal {
	if k.MaxInFlight > 0 && !req.Answered {
		v, ok := l.inFlight.Load(name)
		if !ok {
			v, _ = l.inFlight.LoadOrStore(name, new(atomic.Int64))
		}
		c := v.(*atomic.Int64)
		if c.Add(1) > k.MaxInFlight {
			c.Add(-1)
			ref := refuse(req.Class, http.StatusTooManyRequests, codeInFlight, limitInFlight,
				fmt.Sprintf("the API key %s has %d requests in flight, its limit; retry when one ends", name, k.MaxInFlight),
				map[string]any{"max_in_flight": k.MaxInFlight, "retryable": true, "retry_after_seconds": 1})
			ref.Header, ref.Value = "Retry-After", "1"
			return ref
		}
		req.inFlight = c
	}
	if k.RunTokens == 0 && k.RunSteps == 0 {
		return nil
	}
	id := h.Get(config.RunHeader)
	if id == "" {
		return nil
	}
	if len(id) > config.MaxRunIDLength {
		return refuse(req.Class, http.StatusBadRequest, codeBadRunID, limitRun,
			fmt.Sprintf("the %s header is longer than %d bytes", config.RunHeader, config.MaxRunIDLength), nil)
	}
	rn, st := l.runs.take(clock.Now(), runKey{key: name, id: id}, k, cost)
	var ref *Refusal
	switch {
	case rn != nil:
		req.run, req.held = rn, cost
		return nil
	case st.steps >= k.RunSteps && k.RunSteps > 0:
		ref = refuse(req.Class, http.StatusTooManyRequests, codeRunSteps, limitRun,
			fmt.Sprintf("the run has sent %d requests, the API key %s's limit per run; end the run or start another", st.steps, name),
			map[string]any{"run_max_steps": k.RunSteps, "run_steps": st.steps, "retryable": false})
	default:
		ref = refuse(req.Class, http.StatusTooManyRequests, codeRunBudget, limitRun,
			fmt.Sprintf("this request reserves %d tokens and the run has %d of the API key %s's %d tokens per run left; end the run or send a smaller request",
				cost, max(k.RunTokens-st.spent, 0), name, k.RunTokens),
			map[string]any{"run_token_budget": k.RunTokens, "run_tokens_spent": st.spent, "requested_tokens": cost, "retryable": false})
	}
	ref.Header, ref.Value = "X-Should-Retry", "false"
	return ref
}

// End ends the request's part in the limits for agents when its handler returns.
func (l *Limits) End(req *Request) {
	if c := req.inFlight; c != nil {
		req.inFlight = nil
		c.Add(-1)
	}
	l.Release(req)
}

// Settle counts what the request used in its run in place of its reservation.
func (l *Limits) Settle(req *Request, used int64) {
	if rn := req.run; rn != nil {
		req.run = nil
		l.runs.settle(rn, req.held, used, false)
	}
}

// Release gives the request's reservation and step back to its run: it ran nothing.
func (l *Limits) Release(req *Request) {
	if rn := req.run; rn != nil {
		req.run = nil
		l.runs.settle(rn, req.held, 0, true)
	}
}
