// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/tokenwarden/tokenwarden/proxy/config"
	"github.com/tokenwarden/tokenwarden/proxy/health"
	"github.com/tokenwarden/tokenwarden/proxy/metrics"
	"github.com/tokenwarden/tokenwarden/proxy/refusal"
	"github.com/tokenwarden/tokenwarden/proxy/tokenize"
)

// UpstreamHeader names, on every answer of a registered model, the upstream that
// served it: only that one, so that no caller learns of another caller's failures.
const UpstreamHeader = "X-Tokenwarden-Upstream"

// modelRoute is one entry of the model registry, compiled.
type modelRoute struct {
	name string
	// window and maxOut are the context window and largest output (0: unchecked).
	window, maxOut int64
	// candidates are the upstreams that serve the model, in order; empty when the
	// model names none in the registry (then it is routed by upstreams[].models).
	candidates []candidate
	// tok counts the model's input when the model names a tokenizer (tokenize.go).
	tok *tokenize.Encoding
}

// candidate is one upstream of a registered model.
type candidate struct {
	up *upstream
	// providerModel replaces the model name in the body sent to this upstream.
	providerModel string
	// header is UpstreamHeader's value, made once (a response's header map holds it
	// and nothing changes it).
	header []string
}

// serves reports whether the candidate speaks the route's API family.
func (c *candidate) serves(f refusal.Family) bool {
	switch c.up.provider {
	case config.ProviderOpenAI:
		return f == refusal.OpenAI
	case config.ProviderAnthropic:
		return f == refusal.Anthropic
	}
	return true
}

// attempt is a registered model's failover state within one request.
type attempt struct {
	model *modelRoute
	// body is the request body as the estimate read it, for a provider model's rewrite.
	body []byte
	// more: a later candidate may take the request if this attempt fails before the
	// answer begins. retry: this attempt failed so, and nothing was written.
	more, retry bool
	// cand is the candidate of this attempt.
	cand *candidate
	// first is the candidate the request's slot was taken at (permodel.go): the first
	// attempt goes there, a failover to the ones after it.
	first int
	// rename is the model a budget's fallback serves the request with, and fallback
	// says so in FallbackHeader (providers_fallback.go).
	rename, fallback string
}

// errFailover makes the reverse proxy drop an upstream's failed answer unwritten, so
// that the next upstream may serve the request.
var errFailover = errors.New("failing over to the model's next upstream")

// compileModels builds the registry's routes. It runs after the upstreams are built.
func (rt *runtime) compileModels(cfg *config.Config) {
	rt.models = make(map[string]*modelRoute, len(cfg.Models))
	rt.fallbacks = map[string]string{}
	for _, r := range cfg.RateLimiting.Rules {
		if r.FallbackModel != "" {
			rt.fallbacks[r.Name] = r.FallbackModel
		}
	}
	byName := make(map[string]*upstream, len(rt.upstreams))
	for _, up := range rt.upstreams {
		byName[up.name] = up
	}
	for i := range cfg.Models {
		m := &cfg.Models[i]
		mr := &modelRoute{name: m.Name, window: m.ContextWindow, maxOut: m.MaxOutputTokens}
		for _, mu := range m.Upstreams {
			if up := byName[mu.Upstream]; up != nil {
				mr.candidates = append(mr.candidates, candidate{up: up, providerModel: mu.ProviderModel, header: []string{up.name}})
			}
		}
		mr.tok = tokenize.Get(m.Tokenizer) // nil without one; built on the first config naming it
		if mr.window > 0 || mr.maxOut > 0 || len(mr.candidates) > 0 || rt.fallbacks[m.Name] != "" || mr.tok != nil {
			rt.models[m.Name] = mr
			rt.knownModels[m.Name] = true
		}
		if len(mr.candidates) > 0 {
			// Routed as its first upstream until chooseUpstream picks by health.
			rt.byModel[m.Name] = mr.candidates[0].up
		}
	}
}

// credentialKey is what an upstream's cooldown is kept by: its credential.
func credentialKey(u config.Upstream) string {
	if u.AuthHeaderEnv != "" {
		return "env:" + u.AuthHeaderEnv
	}
	return "upstream:" + u.Name
}

// precheck refuses, with 400 in the route's shape, a request that cannot fit its
// model's context window: the lower bound of its input plus the output it asks for
// (its input alone when it asks for none); or one asking for more output than the
// model generates. It runs before any reservation or upstream call, and reports
// false when it answered.
func (s *Server) precheck(ex *exchange) bool {
	mr := ex.rt.models[ex.est.Model]
	if mr == nil || !ex.route.charged || !ex.est.Parsed {
		return true
	}
	if mr.tok != nil {
		ex.tokenize(mr.tok)
	}
	in, out := ex.est.InputLower, ex.est.OutputCap
	switch mr.overLimit(in, out) {
	case limitModelOutput:
		return s.tooLong(ex, mr, limitModelOutput, fmt.Sprintf("the request asks for %d output tokens; model %q generates at most %d (max_output_tokens)", out, mr.name, mr.maxOut),
			map[string]any{"max_output_tokens": mr.maxOut, "requested_output_tokens": out})
	case limitContextWindow:
		details := map[string]any{"context_window": mr.window, "input_tokens_at_least": in, "requested_output_tokens": out}
		msg := fmt.Sprintf("the request's input of at least %d tokens plus the %d output tokens it asks for is %d, over the context window of %d tokens of model %q",
			in, out, in+out, mr.window, mr.name)
		if out == 0 {
			msg = fmt.Sprintf("the request's input is at least %d tokens, over the context window of %d tokens of model %q", in, mr.window, mr.name)
		}
		return s.tooLong(ex, mr, limitContextWindow, msg, details)
	}
	return true
}

// The limits of a model that a request may not fit, as refusals name them.
const (
	limitModelOutput   = "max_output_tokens"
	limitContextWindow = "context_window"
)

// overLimit is the model's limit that a request of at least in input tokens asking
// for out output tokens cannot fit: more output than the model generates, or input
// plus output over the context window; empty when it fits (or the model sets neither).
func (mr *modelRoute) overLimit(in, out int64) string {
	switch {
	case mr.maxOut > 0 && out > mr.maxOut:
		return limitModelOutput
	case mr.window > 0 && in+out > mr.window:
		return limitContextWindow
	}
	return ""
}

// tooLong answers a pre-check's refusal and counts it.
func (s *Server) tooLong(ex *exchange, mr *modelRoute, limit, msg string, details map[string]any) bool {
	s.metrics.Providers.ContextRefusals.WithLabelValues(mr.name, limit).Inc()
	return ex.fail(http.StatusBadRequest, "context_length_exceeded", msg, &refusal.Body{LimitType: limit, Details: details})
}

// chooseUpstream picks the upstream of a registered model: the first that speaks the route's
// family, with a breaker that lets calls through and a credential that is not cooling.
// When none does, it answers 503 with a Retry-After from the earliest recovery and
// reports false. A model outside the registry keeps its upstream.
func (s *Server) chooseUpstream(ex *exchange) bool {
	mr := ex.rt.models[ex.est.Model]
	if mr == nil || len(mr.candidates) == 0 {
		return true
	}
	ex.try.model = mr
	if !slices.ContainsFunc(mr.candidates, func(c candidate) bool { return c.serves(ex.route.family) }) {
		api := "OpenAI"
		if ex.route.family == refusal.Anthropic {
			api = "Anthropic"
		}
		return ex.fail(http.StatusNotFound, "model_not_found", fmt.Sprintf("no upstream of the model %q speaks the %s API of this route", mr.name, api), nil)
	}
	now := s.clock.Now()
	if i, _ := ex.next(0, now, false); i >= 0 {
		ex.upstream = mr.candidates[i].up
		return true
	}
	return s.unavailable(ex, now)
}

// next is the index of the first candidate from i on that may take the request now,
// or -1 with the earliest time one may. take counts a half-open breaker's probe.
func (ex *exchange) next(i int, now time.Time, take bool) (int, time.Time) {
	mr := ex.try.model
	var earliest time.Time
	for ; i < len(mr.candidates); i++ {
		c := &mr.candidates[i]
		if !c.serves(ex.route.family) {
			continue
		}
		cd := c.up.cooldown
		if until := cd.Until(); now.Before(until) {
			earliest = earlier(earliest, until)
			continue
		}
		b := c.up.breaker
		if take {
			if b.Allow(now) {
				return i, time.Time{}
			}
			_, at := b.Available(now)
			earliest = earlier(earliest, at)
			continue
		}
		ok, at := b.Available(now)
		if ok {
			return i, time.Time{}
		}
		earliest = earlier(earliest, at)
	}
	return -1, earliest
}

func earlier(a, b time.Time) time.Time {
	if a.IsZero() || (!b.IsZero() && b.Before(a)) {
		return b
	}
	return a
}

// unavailable answers 503: every upstream of the model is down or cooling. The
// Retry-After is the earliest recovery; which upstreams failed, and how, is not said.
func (s *Server) unavailable(ex *exchange, now time.Time) bool {
	mr := ex.try.model
	_, at := ex.next(0, now, false)
	wait := max(at.Sub(now), time.Second)
	if at.IsZero() {
		wait = config.DefaultCooldown
	}
	secs := int64(math.Ceil(wait.Seconds()))
	ex.w.Header().Set("Retry-After", strconv.FormatInt(secs, 10))
	s.metrics.Providers.Unavailable.WithLabelValues(mr.name).Inc()
	return ex.fail(http.StatusServiceUnavailable, "upstreams_unavailable",
		fmt.Sprintf("every upstream of model %q is unavailable for now; retry in %d seconds", mr.name, secs),
		&refusal.Body{LimitType: "upstreams", Details: map[string]any{"retry_after_seconds": secs, "retryable": true}})
}

// tryUpstreams sends the request upstream, handed off at now. A registered model's request
// goes to its first available upstream; an error before any byte reached the client
// (a connection error, a timeout, a 5xx or a 429 answer) moves it to the next, with
// the same reservation, which is settled once on the attempt that served it. A stream
// that began is never replayed.
func (s *Server) tryUpstreams(ex *exchange, r *http.Request, now time.Time) {
	mr := ex.try.model
	if mr == nil {
		if ex.try.rename != "" {
			r = ex.attemptRequest(r, &candidate{up: ex.upstream})
		}
		ex.handOff(ex.upstream, now)
		ex.upstream.proxy.ServeHTTP(ex.w, r)
		return
	}
	first := true
	for i := ex.try.first; ; i++ {
		j, _ := ex.next(i, now, true)
		if j < 0 {
			s.unavailable(ex, now)
			return
		}
		i = j
		c := &mr.candidates[i]
		if !first {
			s.metrics.Providers.Failovers.WithLabelValues(mr.name).Inc()
		}
		k, _ := ex.next(i+1, now, false)
		ex.try.more, ex.try.retry, ex.try.cand = k >= 0, false, c
		ex.upstream = c.up
		out := r
		if !first || c.providerModel != "" || ex.try.rename != "" {
			out = ex.attemptRequest(r, c)
		}
		first = false
		ex.handOff(c.up, now)
		c.up.proxy.ServeHTTP(ex.w, out)
		if !ex.try.retry {
			return
		}
		now = s.clock.Now()
	}
}

// attemptRequest is the request for another attempt: its body replayed, with the
// provider's model name when the candidate has one.
func (ex *exchange) attemptRequest(r *http.Request, c *candidate) *http.Request {
	out := r.Clone(r.Context())
	name := c.providerModel
	if name == "" {
		name = ex.try.rename
	}
	if name != "" && ex.try.body != nil {
		if body, err := withModel(ex.try.body, name); err == nil {
			// The body sent is the decoded one, renamed.
			out.Header.Del("Content-Encoding")
			out.Body = io.NopCloser(bytes.NewReader(body))
			out.ContentLength = int64(len(body))
			out.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
			return out
		}
	}
	if r.GetBody != nil {
		out.Body, _ = r.GetBody()
	}
	return out
}

// withModel is a JSON object body with its model replaced.
func withModel(body []byte, model string) ([]byte, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(body, &m); err != nil {
		return nil, err
	}
	name, err := json.Marshal(model)
	if err != nil {
		return nil, err
	}
	m["model"] = name
	return json.Marshal(m)
}

// attemptAnswered records the upstream's answer in its health; a failed answer with
// another upstream to go to is dropped (errFailover) so that the next one serves.
func (s *Server) attemptAnswered(ex *exchange, resp *http.Response) error {
	if ex.try.fallback != "" {
		ex.cw.Header().Set(FallbackHeader, ex.try.fallback)
	}
	c := ex.try.cand
	if c == nil {
		return nil
	}
	now := s.clock.Now()
	code := resp.StatusCode
	switch {
	case code == http.StatusTooManyRequests:
		c.up.breaker.Record(now, health.Unrecorded)
		iv := health.CooldownFor(resp.Header, now)
		c.up.cooldown.Start(now, iv.Applied)
		s.log.Warn("Upstream credential cooling down after a 429", "upstream", c.up.name, "model", ex.try.model.name,
			"requested", iv.Requested, "applied", iv.Applied, "source", iv.Source, "clamped", iv.Clamped)
	case code >= 500:
		c.up.breaker.Record(now, health.Failure)
	default:
		// A caller's 4xx mistake says nothing against the upstream.
		c.up.breaker.Record(now, health.Success)
	}
	if (code == http.StatusTooManyRequests || code >= 500) && ex.try.more {
		ex.try.retry = true
		return errFailover
	}
	ex.cw.Header()[UpstreamHeader] = c.header
	return nil
}

// attemptFailed records an attempt the upstream did not answer; it reports true when
// the next upstream will take the request (nothing is written, nothing released).
func (s *Server) attemptFailed(ex *exchange, r *http.Request, err error) bool {
	c := ex.try.cand
	if c == nil {
		return false
	}
	if errors.Is(err, errFailover) {
		return true
	}
	now := s.clock.Now()
	if r.Context().Err() != nil {
		c.up.breaker.Record(now, health.Unrecorded)
		return false
	}
	c.up.breaker.Record(now, health.Failure)
	if ex.try.more && !errors.Is(err, context.Canceled) {
		s.metrics.UpstreamErrors.WithLabelValues(c.up.name).Inc()
		ex.try.retry = true
		return true
	}
	return false
}

// upstreamHealth is each registry upstream's health, for the metrics and the report.
func (s *Server) upstreamHealth() []metrics.UpstreamHealth {
	rt := s.rt.Load()
	if rt == nil {
		return nil
	}
	now := s.clock.Now()
	var out []metrics.UpstreamHealth
	seen := map[string]bool{}
	for _, mr := range rt.models {
		for _, c := range mr.candidates {
			if seen[c.up.name] {
				continue
			}
			seen[c.up.name] = true
			out = append(out, metrics.UpstreamHealth{
				Upstream:        c.up.name,
				State:           s.health.Breaker(c.up.name).State(now).String(),
				CooldownSeconds: s.health.Cooldown(c.up.credKey).Seconds(),
			})
		}
	}
	slices.SortFunc(out, func(a, b metrics.UpstreamHealth) int {
		switch {
		case a.Upstream < b.Upstream:
			return -1
		case a.Upstream > b.Upstream:
			return 1
		}
		return 0
	})
	return out
}

// forgetHealth drops the breakers and cooldowns of the upstreams and credentials rt no
// longer has, so a removed upstream's state does not stay in memory, and one that comes
// back starts closed and cool.
func (s *Server) forgetHealth(rt *runtime) {
	ups := make(map[string]bool, len(rt.upstreams))
	creds := make(map[string]bool, len(rt.upstreams))
	for _, up := range rt.upstreams {
		ups[up.name], creds[up.credKey] = true, true
	}
	s.health.Forget(func(name string) bool { return ups[name] }, func(c string) bool { return creds[c] })
}
