// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package server

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/proxy/config"
	"github.com/tokenwarden/tokenwarden/proxy/estimate"
	"github.com/tokenwarden/tokenwarden/proxy/metrics"
)

// stage is one step of a request's path. It reports false when it ended the request:
// it answered (a refusal is one call, ex.fail or one of its forms), or the client went
// away.
type stage func(*Server, *exchange) bool

// stages are what happens to a request, in order.
var stages = [...]stage{
	(*Server).configured,
	(*Server).authenticate,
	(*Server).readBody,     // read once, bounded, decoded
	(*Server).estimateBody, // the estimate, before any tokenizer
	(*Server).routeModel,
	(*Server).precheck, // the model's context window, with its tokenizer's count
	(*Server).chooseUpstream,
	// Before admission: what they refuse reserves nothing. The cache is read here, on
	// the body as forwarded, so that a hit takes no slot in flight (cache.go).
	(*Server).agentLimits,
	(*Server).admit,
	// After admission: a hit releases its hold, request limits still count it, and a
	// refused request is never served from the cache.
	(*Server).cacheLookup,
	// A waiter holds its own reservation, never a queue slot.
	(*Server).coalesce,
	// What the cache answered cost nothing; what a cost budget governs and the spend
	// ledger cannot record is refused (settle.go).
	(*Server).recordable,
	(*Server).queue,
	(*Server).forward,
	// What follows the answer, its settlement and the observers told of it (a ledger
	// among them), is settle.go's; finish ends the request's record.
}

// arrive is a request's state as it arrives: its route, the config in force, its
// record's start on the injected clock (every latency is measured from it), its id
// and its server span.
func (s *Server) arrive(w http.ResponseWriter, r *http.Request) *exchange {
	ex := &exchange{rt: s.rt.Load(), route: classify(r.URL), log: s.access}
	ex.rec.Start = s.clock.Now()
	ex.cw.ResponseWriter = w
	ex.w = &ex.cw
	ex.r = s.begin(ex, r)
	return ex
}

// finish ends a request, however it ended: an upstream error, a panic in a handler, a
// client that went away release what is still held (a release after a settlement does
// nothing); then the request is counted and observed.
func (s *Server) finish(ex *exchange) {
	s.release(ex)
	s.cacheFinish(ex)
	s.agents.End(&ex.agent)
	if ex.status == 0 {
		ex.status = http.StatusBadGateway
	}
	ex.rec.Finished = s.clock.Now()
	s.metrics.Requests.WithLabelValues(ex.route.name, metrics.Code(ex.status)).Inc()
	s.metrics.RequestDuration.WithLabelValues(ex.route.name).Observe(ex.rec.Finished.Sub(ex.rec.Start).Seconds())
	ex.rec.BytesIn = max(ex.r.ContentLength, 0)
	if ex.refused != "" {
		s.metrics.Agents.Refused(ex.agent.Class.String(), ex.refused)
	}
	s.observe(ex)
}

// configured answers 503 until a config is in force.
func (s *Server) configured(ex *exchange) bool {
	if ex.rt != nil {
		return true
	}
	return ex.fail(http.StatusServiceUnavailable, "unavailable", "the proxy has no configuration yet", nil)
}

// authenticate finds the key the client presents; without one, the request is
// anonymous unless the config requires a key.
func (s *Server) authenticate(ex *exchange) bool {
	presented, ok := credential(ex.r)
	if !ok {
		if ex.rt.authMode == config.AuthRequired {
			return ex.fail(http.StatusUnauthorized, "authentication", "an API key is required: send it as Authorization: Bearer KEY or x-api-key: KEY", nil)
		}
		return true
	}
	key := ex.rt.keys[sha256.Sum256([]byte(presented))]
	if key == nil {
		return ex.fail(http.StatusUnauthorized, "authentication", "the API key is not valid", nil)
	}
	ex.key = key
	ex.rec.APIKey, ex.rec.User, ex.rec.Team = key.Name, key.User, key.Team
	return true
}

// readBody reads the body of a charged request, or of any request when several
// upstreams may serve it (its model routes it): once, bounded by max_body_bytes, and
// replayed to the upstream. A charged body is decoded as the upstream will read it.
func (s *Server) readBody(ex *exchange) bool {
	r := ex.r
	if r.Body == nil || r.Body == http.NoBody || (!ex.route.charged && len(ex.rt.Upstreams) < 2) {
		return true
	}
	body, ok := ex.readAll(ex.rt.maxBody)
	if ok && ex.route.charged {
		body, ok = ex.decodedBody(body, ex.rt.maxBody)
	}
	ex.body = body
	return ok
}

// estimateBody estimates a charged request's tokens; another request's body only
// names its model.
func (s *Server) estimateBody(ex *exchange) bool {
	if ex.body == nil {
		return true
	}
	if !ex.route.charged {
		ex.est.Model = estimate.Model(ex.body)
		return true
	}
	scan := estimate.Body
	if ex.rt.tokenizes {
		scan = estimate.BodyView // for precheck's tokenizer
	}
	est, err := scan(ex.body)
	if err != nil {
		// Nested deeper than any upstream reads: refused as upstreams refuse it.
		return ex.fail(http.StatusBadRequest, "invalid_request", err.Error(), nil)
	}
	ex.est = est
	ex.try.Body = ex.body
	return true
}

// routeModel finds the upstream that serves the request's model.
func (s *Server) routeModel(ex *exchange) bool {
	ex.upstream = ex.rt.Route(ex.est.Model)
	if ex.upstream == nil {
		return ex.fail(http.StatusNotFound, "model_not_found", fmt.Sprintf("no upstream serves the model %q", ex.est.Model), nil)
	}
	return true
}

// admit reserves the request's estimate in its budgets (or a budget's fallback model's,
// when one refuses it) and answers a refusal or a store that cannot decide.
func (s *Server) admit(ex *exchange) bool {
	rt := ex.rt
	id, ok := ex.identity()
	if !ok {
		return false
	}
	ask := ex.ask()
	actx := ex.r.Context()
	var asp trace.Span
	if s.tracing != nil {
		actx, asp = s.tracing.admission(actx, s.clock.Now())
	}
	dec, err := s.limiter.Admit(actx, rt.policy, id, ask)
	if err == nil && dec.Refusal != nil && len(rt.Fallbacks) > 0 {
		dec = s.fallback(ex.r.Context(), ex, id, ask, dec)
	}
	if err == nil {
		ex.admitted(&id, &dec)
	}
	if asp != nil {
		s.tracing.admitted(asp, ex, err, s.clock.Now())
	}
	if err != nil {
		return ex.storeFailed(err, s.ledgerAttests)
	}
	ex.dec, ex.hold = dec, dec.Hold
	if dec.Refusal != nil {
		s.countBudgetRefusal(dec.Refusal, id.Model)
		return ex.refuse(dec.Refusal, s.clock.Now())
	}
	return true
}

// identity is who the request is to its budgets, with its attributes on the serving
// upstream; false when it was refused for an attribute out of bounds.
func (ex *exchange) identity() (budget.Identity, bool) {
	rt := ex.rt
	client := rt.clientAddr(ex.r)
	id := budget.Identity{Key: ex.key, Model: ex.est.Model, Exempt: client.IsValid() && contains(rt.whitelist, client)}
	id.Client = rt.clientIdentity(client)
	return id, ex.attributes(&id)
}

// ask is what the request asks of its budgets: its estimate on a charged route.
func (ex *exchange) ask() budget.Ask {
	if !ex.route.charged {
		return budget.Ask{}
	}
	return budget.Ask{Input: ex.est.Input, Output: ex.est.Output}
}

// countBudgetRefusal counts a budget's refusal for the usage report.
func (s *Server) countBudgetRefusal(ref *budget.Refusal, model string) {
	if s.refusals == nil {
		return
	}
	if ref.Rule != "" {
		s.refusals.RefusedRule(ref.Rule, ref.WindowIndex)
		return
	}
	kind := ref.Period
	if ref.Requests {
		kind = budget.Requests
	}
	s.refusals.Refused(ref.Dimension, kind, model)
}

// storeFailed answers 503 for a budget store that could not decide; fromLedger: the
// fleet attests lost counters from its spend ledger on its own.
func (ex *exchange) storeFailed(err error, fromLedger bool) bool {
	var unavailable *budget.UnavailableError
	var recovering *budget.RecoveringError
	switch {
	case errors.As(err, &recovering):
		ex.w.Header().Set("Retry-After", recoveringRetryAfter)
		return ex.fail(http.StatusServiceUnavailable, "budget_recovering", recovering.ClientMessage(fromLedger), nil)
	case errors.As(err, &unavailable):
		retry, msg := "5", "the budget store is unreachable; retry later"
		if unavailable.RetryAfter > 0 {
			retry = strconv.Itoa(max(1, int(unavailable.RetryAfter.Round(time.Second)/time.Second)))
		}
		if unavailable.Message != "" {
			msg = unavailable.Message
		}
		ex.w.Header().Set("Retry-After", retry)
		return ex.fail(http.StatusServiceUnavailable, "budget_store_unavailable", msg, nil)
	}
	return ex.fail(http.StatusServiceUnavailable, "budget_store_unavailable", "admission failed: "+err.Error(), nil)
}

// queue takes the request's place in its upstream's capacity, when the upstream
// declares one (docs/proxy-config.md "Scheduling"); the request waits holding its
// reservation.
func (s *Server) queue(ex *exchange) bool {
	if sc := ex.upstream.Sched; sc != nil {
		return s.wait(ex, sc)
	}
	return true
}

// forward hands the request to the upstream. Its latency is measured from here, after
// any wait for capacity (the queue wait's own histogram), so the two never overlap.
func (s *Server) forward(ex *exchange) bool {
	ctx := ex.r.Context()
	at := s.clock.Now()
	if s.tracing != nil {
		ctx = s.tracing.upstream(ctx, ex, at)
	}
	s.tryUpstreams(ex, ex.r.WithContext(ex.upstreamContext(ctx)), at)
	return true
}

// upstreamContext is ctx carrying the request's state (holdKey) to the reverse
// proxy's callbacks; a coalesced call's leader's outlives its client for its waiters
// (cache.Call.Context, which carries the state itself).
func (ex *exchange) upstreamContext(ctx context.Context) context.Context {
	if c := ex.cache.call; c != nil {
		return c.Context(ctx, holdKey{}, ex)
	}
	return context.WithValue(ctx, holdKey{}, ex)
}
