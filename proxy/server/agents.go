// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package server

import (
	"bytes"
	"container/list"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/proxy/config"
	"github.com/tokenwarden/tokenwarden/proxy/estimate"
	"github.com/tokenwarden/tokenwarden/proxy/refusal"
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

// agents is the server's state for the limits for agents, kept across reloads: each
// key's requests in flight, and the runs.
type agents struct {
	// inFlight holds an *atomic.Int64 per key name with a max_in_flight.
	inFlight sync.Map
	runs     runTable
}

// configure applies the config's bounds on the runs kept.
func (a *agents) configure(cfg *config.Config) {
	a.runs.configure(cfg.Agents.Runs(), cfg.Agents.RunIdle())
}

// agentState is one request's part in the limits for agents.
type agentState struct {
	// class is the request's priority class: its key's, lowered by the header.
	class schedule.Class
	// inFlight is the key's counter the request counts in, until the handler returns.
	inFlight *atomic.Int64
	// run is the request's run and held what the request reserved of it, until the
	// request settles or is released.
	run  *run
	held int64
}

// classOf is a request's priority class: its key's (interactive for anonymous
// requests), lowered by the x-tokenwarden-priority header and never raised.
func (ex *exchange) classOf(r *http.Request, key *budget.KeyPolicy) schedule.Class {
	c := schedule.Interactive
	if key != nil {
		c = ex.rt.keySched[key.Name].class
	}
	if h := r.Header.Get(config.PriorityHeader); h != "" {
		if asked, ok := schedule.ParseClass(strings.ToLower(strings.TrimSpace(h))); ok {
			c = schedule.Lower(c, asked)
		}
	}
	return c
}

// agentLimits applies the limits for agents before budget admission, so that a request
// they refuse takes no reservation: the class's output cap (which may rewrite the body
// and its estimate), the key's in-flight generations, and its run's budget and steps.
// It answers a refusal itself and reports false when the request must stop.
func (ex *exchange) agentLimits(w http.ResponseWriter, r *http.Request, key *budget.KeyPolicy, body []byte) bool {
	ex.agent.class = ex.classOf(r, key)
	if ex.route.charged && body != nil {
		if !ex.capOutput(w, r, body) {
			return false
		}
	}
	if key == nil {
		return true
	}
	ks := ex.rt.keySched[key.Name]
	if ks.maxInFlight > 0 {
		v, ok := ex.s.agents.inFlight.Load(key.Name)
		if !ok {
			v, _ = ex.s.agents.inFlight.LoadOrStore(key.Name, new(atomic.Int64))
		}
		c := v.(*atomic.Int64)
		if c.Add(1) > ks.maxInFlight {
			c.Add(-1)
			w.Header().Set("Retry-After", "1")
			ex.refuseAgent(w, http.StatusTooManyRequests, codeInFlight, limitInFlight,
				fmt.Sprintf("the API key %s has %d requests in flight, its limit; retry when one ends", key.Name, ks.maxInFlight),
				map[string]any{"max_in_flight": ks.maxInFlight, "retryable": true, "retry_after_seconds": 1})
			return false
		}
		ex.agent.inFlight = c
	}
	if ks.runTokens == 0 && ks.runSteps == 0 {
		return true
	}
	id := r.Header.Get(config.RunHeader)
	if id == "" {
		return true
	}
	if len(id) > config.MaxRunIDLength {
		ex.refuseAgent(w, http.StatusBadRequest, codeBadRunID, limitRun,
			fmt.Sprintf("the %s header is longer than %d bytes", config.RunHeader, config.MaxRunIDLength), nil)
		return false
	}
	cost := ex.est.Total()
	rn, st := ex.s.agents.runs.take(ex.s.clock.Now(), runKey{key: key.Name, id: id}, ks, cost)
	switch {
	case rn != nil:
		ex.agent.run, ex.agent.held = rn, cost
		return true
	case st.steps >= ks.runSteps && ks.runSteps > 0:
		w.Header().Set("X-Should-Retry", "false")
		ex.refuseAgent(w, http.StatusTooManyRequests, codeRunSteps, limitRun,
			fmt.Sprintf("the run has sent %d requests, the API key %s's limit per run; end the run or start another", st.steps, key.Name),
			map[string]any{"run_max_steps": ks.runSteps, "run_steps": st.steps, "retryable": false})
	default:
		w.Header().Set("X-Should-Retry", "false")
		ex.refuseAgent(w, http.StatusTooManyRequests, codeRunBudget, limitRun,
			fmt.Sprintf("this request reserves %d tokens and the run has %d of the API key %s's %d tokens per run left; end the run or send a smaller request",
				cost, max(ks.runTokens-st.spent, 0), key.Name, ks.runTokens),
			map[string]any{"run_token_budget": ks.runTokens, "run_tokens_spent": st.spent, "requested_tokens": cost, "retryable": false})
	}
	return false
}

// refuseAgent answers a refusal of the limits for agents in the route's shape.
func (ex *exchange) refuseAgent(w http.ResponseWriter, status int, code, limitType, msg string, details map[string]any) {
	if details == nil {
		details = map[string]any{}
	}
	details["class"] = ex.agent.class.String()
	// The code again, for the Anthropic shape, which has no code field.
	details["reason"] = code
	ex.fail(w, status, code, msg, &refusal.Body{LimitType: limitType, Details: details})
}

// endAgent ends the request's part in the limits for agents when its handler returns.
func (ex *exchange) endAgent() {
	if c := ex.agent.inFlight; c != nil {
		ex.agent.inFlight = nil
		c.Add(-1)
	}
	ex.releaseRun()
}

// settleRun counts what the request used in its run in place of its reservation.
func (ex *exchange) settleRun(used int64) {
	if rn := ex.agent.run; rn != nil {
		ex.agent.run = nil
		ex.s.agents.runs.settle(rn, ex.agent.held, used, false)
	}
}

// releaseRun gives the request's reservation and step back to its run: it ran nothing.
func (ex *exchange) releaseRun() {
	if rn := ex.agent.run; rn != nil {
		ex.agent.run = nil
		ex.s.agents.runs.settle(rn, ex.agent.held, 0, true)
	}
}

// capOutput applies the class's max_output_tokens to a charged request: a stated
// limit above the cap is refused (over_max_output_tokens: refuse) or lowered to it,
// and a request that states none gets the cap; a changed body is estimated again and
// forwarded plain.
func (ex *exchange) capOutput(w http.ResponseWriter, r *http.Request, body []byte) bool {
	lim := ex.rt.classLimits[ex.agent.class]
	if lim.MaxOutputTokens <= 0 {
		return true
	}
	limCap := lim.MaxOutputTokens
	if ex.est.Output <= limCap && ex.est.Output != estimate.DefaultOutput {
		// The request states a limit (the default is what it reserves without one), and
		// every completion's is at most its total: nothing to read.
		return true
	}
	spans, err := outputLimits(body)
	if err != nil {
		// Not a JSON object: the estimate's fallback stands, and the upstream refuses it.
		return true
	}
	var over []outputSpan
	for _, s := range spans {
		if s.value > limCap {
			over = append(over, s)
		}
	}
	if len(spans) > 0 && len(over) == 0 {
		return true
	}
	if len(over) > 0 && lim.OverMaxOutputTokens == config.OverRefuse {
		ex.refuseAgent(w, http.StatusBadRequest, codeMaxTokens, limitMaxTokens,
			fmt.Sprintf("%s is %d, above the %s class's cap of %d output tokens: send %d or less",
				over[0].field, over[0].value, ex.agent.class, limCap, limCap),
			map[string]any{"param": over[0].field, "max_output_tokens": limCap})
		return false
	}
	var out []byte
	if len(spans) == 0 {
		out = insertOutputLimit(body, outputField(ex.route.name), limCap)
	} else {
		out = replaceSpans(body, over, limCap)
	}
	est, err := estimate.Body(out)
	if err != nil {
		return true
	}
	ex.keepTokenized(&est)
	ex.est = est
	if ex.try.body != nil {
		// An attempt under a provider's model name is rewritten from this body.
		ex.try.body = out
	}
	r.Body = io.NopCloser(bytes.NewReader(out))
	r.ContentLength = int64(len(out))
	r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(out)), nil }
	r.Header.Del("Content-Encoding")
	r.Header.Set("Content-Length", strconv.Itoa(len(out)))
	return true
}

// outputField is the output limit a route reads.
func outputField(route string) string {
	switch route {
	case "/v1/responses", "/v1/responses/compact":
		return "max_output_tokens"
	case "/v1/chat/completions":
		return "max_completion_tokens"
	}
	return "max_tokens"
}

// outputSpan is one top-level output limit of a body: its field, value, and where its
// value's bytes are.
type outputSpan struct {
	field      string
	value      int64
	start, end int
}

var errNotObject = errors.New("the body is not a JSON object")

// outputLimits lists a JSON object's top-level output limits (every occurrence).
func outputLimits(body []byte) ([]outputSpan, error) {
	dec := json.NewDecoder(bytes.NewReader(body))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return nil, errNotObject
	}
	var out []outputSpan
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return nil, err
		}
		k, _ := t.(string)
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, err
		}
		switch k {
		case "max_tokens", "max_completion_tokens", "max_output_tokens":
			end := int(dec.InputOffset())
			out = append(out, outputSpan{field: k, value: estimate.Ceiling(raw), start: end - len(raw), end: end})
		}
	}
	return out, nil
}

// replaceSpans writes limCap in place of each span's value.
func replaceSpans(body []byte, spans []outputSpan, limCap int64) []byte {
	v := strconv.FormatInt(limCap, 10)
	out := make([]byte, 0, len(body)+len(v)*len(spans))
	at := 0
	for _, s := range spans {
		out = append(out, body[at:s.start]...)
		out = append(out, v...)
		at = s.end
	}
	return append(out, body[at:]...)
}

// insertOutputLimit adds "field": limCap as a JSON object's first member.
func insertOutputLimit(body []byte, field string, limCap int64) []byte {
	i := bytes.IndexByte(body, '{')
	member := `"` + field + `":` + strconv.FormatInt(limCap, 10)
	if len(bytes.TrimSpace(body[i+1:])) > 1 { // more than the closing brace
		member += ","
	}
	out := make([]byte, 0, len(body)+len(member))
	out = append(out, body[:i+1]...)
	out = append(out, member...)
	return append(out, body[i+1:]...)
}

// runKey names a run: its API key and its run id, so a run is its key's own.
type runKey struct{ key, id string }

// run is one agent run's spending.
type run struct {
	k runKey
	// spent is what ended requests used; held what requests in flight reserved.
	spent, held, steps int64
	seen               time.Time
	elem               *list.Element
}

// runStats is a run's state when a request was refused.
type runStats struct{ spent, steps int64 }

// runTable keeps the runs, bounded in number, most recently seen first; a run idle
// past the idle time, or the least recently seen when the table is full, is forgotten.
type runTable struct {
	mu   sync.Mutex
	m    map[runKey]*run
	lru  list.List // of *run, most recently seen first
	max  int
	idle time.Duration
}

func (t *runTable) configure(maxRuns int, idle time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.max, t.idle = maxRuns, idle
	for t.lru.Len() > t.max {
		t.dropLocked(t.lru.Back().Value.(*run))
	}
}

func (t *runTable) dropLocked(r *run) {
	t.lru.Remove(r.elem)
	delete(t.m, r.k)
}

// take counts a request of cost tokens in its run when the key's limits allow it, and
// returns the run; otherwise nil and the run's state.
func (t *runTable) take(now time.Time, k runKey, ks keySched, cost int64) (*run, runStats) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.m == nil {
		t.m = map[runKey]*run{}
	}
	for e := t.lru.Back(); e != nil && now.Sub(e.Value.(*run).seen) >= t.idle; e = t.lru.Back() {
		t.dropLocked(e.Value.(*run))
	}
	r := t.m[k]
	if r == nil {
		if t.max > 0 && t.lru.Len() >= t.max {
			t.dropLocked(t.lru.Back().Value.(*run))
		}
		r = &run{k: k}
		r.elem = t.lru.PushFront(r)
		t.m[k] = r
	}
	r.seen = now
	t.lru.MoveToFront(r.elem)
	if ks.runSteps > 0 && r.steps >= ks.runSteps || ks.runTokens > 0 && r.spent+r.held+cost > ks.runTokens {
		return nil, runStats{spent: r.spent + r.held, steps: r.steps}
	}
	r.steps++
	r.held += cost
	return r, runStats{}
}

// settle ends a request of the run that held held tokens: it used used; released, it
// ran nothing and its step is given back too.
func (t *runTable) settle(r *run, held, used int64, released bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	r.held -= held
	r.spent += used
	if released {
		r.steps--
	}
}

// Runs returns the number of runs the proxy keeps.
func (s *Server) Runs() int {
	s.agents.runs.mu.Lock()
	defer s.agents.runs.mu.Unlock()
	return s.agents.runs.lru.Len()
}

// retryCountHeader is the retry count the official OpenAI and Anthropic SDKs send:
// 0 on a first attempt, n on the n-th retry.
const retryCountHeader = "X-Stainless-Retry-Count"

// countRefusal counts a refusal by the request's class and its reason: the refusal's
// code, or for a budget's, its limit type.
func (ex *exchange) countRefusal(code, limitType string) {
	reason := code
	if code == "rate_limit_exceeded" {
		reason = limitType
	}
	ex.s.metrics.Agents.Refused(ex.agent.class.String(), reason)
}

// countServed counts the tokens served to the request's key's team.
func (ex *exchange) countServed(input, output int64) {
	if ex.key == "" {
		return
	}
	if kp := ex.rt.policy.Key(ex.key); kp != nil && kp.Team != "" {
		ex.s.metrics.Agents.AddTeamUsage(kp.Team, input, output)
	}
}

// forgetTeams drops the usage series of teams no key of cfg names.
func (s *Server) forgetTeams(cfg *config.Config) {
	teams := map[string]bool{}
	for i := range cfg.APIKeys {
		teams[cfg.APIKeys[i].Team] = true
	}
	s.metrics.Agents.ForgetTeams(func(t string) bool { return teams[t] })
}
