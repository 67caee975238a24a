// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package server

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/tokenwarden/tokenwarden/proxy/agentlimit"
	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/proxy/config"
	"github.com/tokenwarden/tokenwarden/proxy/metrics"
	"github.com/tokenwarden/tokenwarden/proxy/refusal"
	"github.com/tokenwarden/tokenwarden/proxy/schedule"
	"github.com/tokenwarden/tokenwarden/proxy/upstream"
)

// UpstreamHeader names, on every answer of a registered model, the upstream that
// served it: only that one, so that no caller learns of another caller's failures.
const UpstreamHeader = "X-Tokenwarden-Upstream"

// ClampHeader says, on the answer to a request whose output cap the admission policy
// clamp lowered, from what to what and which limit: "8000 -> 6000 (context_window)".
const ClampHeader = "X-Tokenwarden-Output-Clamped"

// precheck refuses, with 400 in the route's shape, a request that cannot fit its
// model's context window: the lower bound of its input plus the output it asks for
// (its input alone when it asks for none); or one asking for more output than the
// model generates. Under the admission policy clamp, such a request that states an
// output cap and whose input leaves room is forwarded with its cap lowered to the
// room instead (clamp). It runs before any reservation or upstream call, and reports
// false when it answered.
func (s *Server) precheck(ex *exchange) bool {
	mr := ex.rt.Models[ex.est.Model]
	if mr == nil || !ex.route.charged || !ex.est.Parsed {
		return true
	}
	if mr.Toks != nil {
		ex.tokenize(mr.Toks)
	}
	in, out := ex.est.InputLower, ex.est.OutputCap
	limit := mr.OverLimit(in, out)
	if limit != "" && mr.Clamp && out > 0 && mr.Room(in) > 0 {
		return s.clamp(ex, mr, limit)
	}
	switch limit {
	case upstream.LimitModelOutput:
		return s.tooLong(ex, mr, upstream.LimitModelOutput, fmt.Sprintf("the request asks for %d output tokens; model %q generates at most %d (max_output_tokens)", out, mr.Name, mr.MaxOut),
			map[string]any{"max_output_tokens": mr.MaxOut, "requested_output_tokens": out})
	case upstream.LimitContextWindow:
		details := map[string]any{"context_window": mr.Window, "input_tokens_at_least": in, "requested_output_tokens": out}
		msg := fmt.Sprintf("the request's input of at least %d tokens plus the %d output tokens it asks for is %d, over the context window of %d tokens of model %q",
			in, out, in+out, mr.Window, mr.Name)
		if out == 0 {
			msg = fmt.Sprintf("the request's input is at least %d tokens, over the context window of %d tokens of model %q", in, mr.Window, mr.Name)
		}
		return s.tooLong(ex, mr, upstream.LimitContextWindow, msg, details)
	}
	ex.admittedOutput(mr)
	return true
}

// clamp forwards an over-ask with its output cap lowered to what the model and its
// window leave after the input's lower bound; the reservation is then taken on the
// lowered cap. The answer's ClampHeader says so.
func (s *Server) clamp(ex *exchange, mr *upstream.Model, limit string) bool {
	from, room := ex.est.OutputCap, mr.Room(ex.est.InputLower)
	lim := config.ClassLimits{MaxOutputTokens: room, OverMaxOutputTokens: config.OverClamp}
	out, est, _ := agentlimit.CapOutput(lim, schedule.Interactive, ex.route.name, ex.body, ex.est)
	if out == nil {
		// Not rewritable (the estimate's fallback): refused as refuse refuses it.
		return s.tooLong(ex, mr, limit, fmt.Sprintf("the request asks for %d output tokens; model %q leaves room for %d", from, mr.Name, room),
			map[string]any{"requested_output_tokens": from, "room_output_tokens": room})
	}
	ex.setBody(out, est)
	ex.admittedOutput(mr)
	s.metrics.Providers.ContextClamps.WithLabelValues(mr.Name, limit).Inc()
	ex.w.Header().Set(ClampHeader, strconv.FormatInt(from, 10)+" -> "+strconv.FormatInt(room, 10)+" ("+limit+")")
	return true
}

// admittedOutput records the output the model's context admission lets the request
// have: its cap, or what the model and its window leave when it states none.
func (ex *exchange) admittedOutput(mr *upstream.Model) {
	out := ex.est.OutputCap
	if room := mr.Room(ex.est.InputLower); out <= 0 || (room >= 0 && room < out) {
		out = max(room, 0)
	}
	ex.rec.OutputAdmitted = out
}

// tooLong answers a pre-check's refusal and counts it.
func (s *Server) tooLong(ex *exchange, mr *upstream.Model, limit, msg string, details map[string]any) bool {
	s.metrics.Providers.ContextRefusals.WithLabelValues(mr.Name, limit).Inc()
	return ex.fail(http.StatusBadRequest, "context_length_exceeded", msg, &refusal.Body{LimitType: limit, Details: details})
}

// chooseUpstream picks the upstream of a registered model: the first that speaks the route's
// family, with a breaker that lets calls through and a credential that is not cooling.
// When none does, it answers 503 with a Retry-After from the earliest recovery and
// reports false. A model outside the registry keeps its upstream.
func (s *Server) chooseUpstream(ex *exchange) bool {
	defer ex.est.DropView() // the tokenizers, the last readers of the body's view, ran
	mr := ex.rt.Models[ex.est.Model]
	if mr == nil || len(mr.Candidates) == 0 {
		return true
	}
	ex.try.Model = mr
	if !slices.ContainsFunc(mr.Candidates, func(c upstream.Candidate) bool { return c.Up.Serves(ex.route.family) }) {
		api := "OpenAI"
		if ex.route.family == refusal.Anthropic {
			api = "Anthropic"
		}
		return ex.fail(http.StatusNotFound, "model_not_found", fmt.Sprintf("no upstream of the model %q speaks the %s API of this route", mr.Name, api), nil)
	}
	now := s.clock.Now()
	if i, _, _ := mr.Pick(0, ex.route.family, now, false); i >= 0 {
		ex.upstream = mr.Candidates[i].Up
		return true
	}
	if mr.Substitute != "" && s.substitute(ex, mr, now) {
		return true
	}
	return s.unavailable(ex, now)
}

// substitute moves a request of mr, whose every upstream is unavailable, to mr's
// unavailable_fallback before any attempt: its window (with its encodings' count in
// tokenizer mode) and health decide here, its budgets at admission, which then
// charges it. It reports false, changing nothing, when the substitute cannot serve.
func (s *Server) substitute(ex *exchange, mr *upstream.Model, now time.Time) bool {
	est := ex.est
	if sub := ex.rt.Models[mr.Substitute]; sub != nil && sub.Toks != nil {
		ex.tokenize(sub.Toks)
	}
	sub, up, ok := ex.rt.Substitute(mr, ex.est.InputLower, ex.est.OutputCap, ex.route.family, now)
	if !ok {
		ex.est = est
		return false
	}
	ex.try = upstream.Attempt{Model: sub, Body: ex.try.Body, Rename: sub.Name,
		Fallback: "fallback(" + mr.Name + " -> " + sub.Name + ", pre-attempt, unavailable)"}
	ex.upstream, ex.est.Model = up, sub.Name
	ex.admittedOutput(sub)
	s.metrics.Providers.Substitutions.WithLabelValues(mr.Name, sub.Name).Inc()
	return true
}

// unavailable answers 503: every upstream of the model is down or cooling. The
// Retry-After is the earliest recovery; which upstreams failed, and how, is not said.
func (s *Server) unavailable(ex *exchange, now time.Time) bool {
	mr := ex.try.Model
	_, _, at := mr.Pick(0, ex.route.family, now, false)
	wait := max(at.Sub(now), time.Second)
	if at.IsZero() {
		wait = config.DefaultCooldown
	}
	secs := int64(math.Ceil(wait.Seconds()))
	ex.w.Header().Set("Retry-After", strconv.FormatInt(secs, 10))
	s.metrics.Providers.Unavailable.WithLabelValues(mr.Name).Inc()
	return ex.fail(http.StatusServiceUnavailable, "upstreams_unavailable",
		fmt.Sprintf("every upstream of model %q is unavailable for now; retry in %d seconds", mr.Name, secs),
		&refusal.Body{LimitType: "upstreams", Details: map[string]any{"retry_after_seconds": secs, "retryable": true}})
}

// tryUpstreams sends the request upstream, handed off at now. A registered model's
// request goes to its first available upstream; an error before any byte reached the
// client (a connection error, a timeout, a 5xx or a 429 answer) moves it to the next,
// with the same reservation, which is settled once on the attempt that served it. A
// stream that began is never replayed. Each attempt's upstream is chosen once, by
// upstream.Attempt.Next.
func (s *Server) tryUpstreams(ex *exchange, r *http.Request, now time.Time) {
	try := &ex.try
	if try.Model == nil {
		if try.Rename != "" {
			r = ex.attemptRequest(r, &upstream.Candidate{Up: ex.upstream})
		}
		ex.handOff(ex.upstream, now)
		ex.upstream.Proxy.ServeHTTP(ex.w, r)
		return
	}
	for first := true; ; first = false {
		c, _ := try.Next(ex.route.family, now)
		if c == nil {
			s.unavailable(ex, now)
			return
		}
		if !first {
			s.metrics.Providers.Failovers.WithLabelValues(try.Model.Name).Inc()
		}
		if !first {
			switch s.recount(ex, r, c.Up) {
			case recountAnswered:
				return
			case recountMoved:
				// To a budget's fallback model, admitted on its upstream: its
				// attempts start over (a request moves once).
				s.tryUpstreams(ex, r, now)
				return
			}
		}
		ex.upstream = c.Up
		out := r
		if !first || c.ProviderModel != "" || try.Rename != "" {
			out = ex.attemptRequest(r, c)
		}
		ex.handOff(c.Up, now)
		c.Up.Proxy.ServeHTTP(ex.w, out)
		if !try.Retry() {
			return
		}
		now = s.clock.Now()
	}
}

// recounted is what recount did with a failed-over request.
type recounted int

const (
	// recountKept: the request goes on to the upstream asked for.
	recountKept recounted = iota
	// recountMoved: the serving upstream's budget refused it and the refusing rule's
	// fallback model took it (ex.try and ex.upstream are the fallback's).
	recountMoved
	// recountAnswered: it was answered, refused or failed by the store.
	recountAnswered
)

// recount moves a failed-over request's charge to the upstream that takes it, when a
// rule selects on or counts by the provider and the upstream is another: the first
// upstream's hold is released and the request admitted again as the new upstream's,
// before any byte of it is sent there. A refusal there is handled as at the first
// admission: the refusing rule's fallback model serves the request when it can, or
// the refusal is the client's answer.
func (s *Server) recount(ex *exchange, r *http.Request, up *upstream.Upstream) recounted {
	if !ex.rt.policy.Reads().Has(budget.AttrProvider) || ex.upstream == nil || ex.upstream.Name == up.Name {
		return recountKept
	}
	ex.upstream = up
	id, ok := ex.identity()
	if !ok {
		return recountAnswered
	}
	if id.Exempt || (id.Key != nil && id.Key.Bypass) {
		return recountKept
	}
	ex.hold.Release()
	ex.hold, ex.dec = nil, budget.Decision{}
	ask := ex.ask()
	dec, err := s.limiter.Admit(r.Context(), ex.rt.policy, id, ask)
	moved := false
	if err == nil && dec.Refusal != nil && len(ex.rt.Fallbacks) > 0 {
		dec = s.fallback(r.Context(), ex, id, ask, dec)
		moved = dec.Refusal == nil
	}
	if err == nil {
		ex.admitted(&id, &dec)
	}
	if err != nil {
		ex.storeFailed(err, s.ledgerAttests)
		return recountAnswered
	}
	ex.dec, ex.hold = dec, dec.Hold
	switch {
	case dec.Refusal != nil:
		s.countBudgetRefusal(dec.Refusal, id.Model)
		ex.refuse(dec.Refusal, s.clock.Now())
		return recountAnswered
	case moved:
		return recountMoved
	}
	return recountKept
}

// attemptRequest is the request for another attempt: its body replayed, with the
// provider's model name when the candidate has one.
func (ex *exchange) attemptRequest(r *http.Request, c *upstream.Candidate) *http.Request {
	out := r.Clone(r.Context())
	name := c.ProviderModel
	if name == "" {
		name = ex.try.Rename
	}
	if name != "" && ex.try.Body != nil {
		if body, ok := ex.est.Renamed(ex.try.Body, name); ok {
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

// attemptAnswered records the upstream's answer in its health; a failed answer with
// another upstream to go to is dropped (upstream.ErrFailover) so that the next one
// serves.
func (s *Server) attemptAnswered(ex *exchange, resp *http.Response) error {
	if ex.try.Fallback != "" {
		ex.cw.Header().Set(FallbackHeader, ex.try.Fallback)
	}
	c := ex.try.Cand
	if c == nil {
		return nil
	}
	var body []byte
	if upstream.Peeks(resp.StatusCode) {
		body = peekBody(resp)
	}
	if ex.try.Answered(resp.StatusCode, resp.Header, body, s.clock.Now(), s.log) {
		return upstream.ErrFailover
	}
	ex.cw.Header()[UpstreamHeader] = c.Header
	return nil
}

// peekLimit bounds what is read of an error answer's body to tell a billing error.
const peekLimit = 16 << 10

// peekBody reads the start of an error answer's body, decoded, and puts it back in
// front of the rest so that the client still gets the answer whole.
func peekBody(resp *http.Response) []byte {
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, peekLimit))
	resp.Body = peekedBody{Reader: io.MultiReader(bytes.NewReader(raw), resp.Body), Closer: resp.Body}
	codings, ok := contentCodings(resp.Header)
	if !ok || len(codings) == 0 {
		return raw
	}
	decoded, err := decodeRequest(raw, codings, 4*peekLimit)
	if err != nil {
		return nil
	}
	return decoded
}

// peekedBody is a body whose start was read and put back.
type peekedBody struct {
	io.Reader
	io.Closer
}

// attemptFailed records an attempt the upstream did not answer; it reports true when
// the next upstream will take the request (nothing is written, nothing released).
func (s *Server) attemptFailed(ex *exchange, r *http.Request, err error) bool {
	c := ex.try.Cand
	if c == nil {
		return false
	}
	if errors.Is(err, upstream.ErrFailover) {
		return true
	}
	if ex.try.Failed(err, r.Context().Err() != nil, s.clock.Now()) {
		s.metrics.UpstreamErrors.WithLabelValues(c.Up.Name).Inc()
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
	for _, mr := range rt.Models {
		for _, c := range mr.Candidates {
			if seen[c.Up.Name] {
				continue
			}
			seen[c.Up.Name] = true
			cd := s.health.Cooldown(c.Up.CredKey)
			u := metrics.UpstreamHealth{
				Upstream:        c.Up.Name,
				State:           s.health.Breaker(c.Up.Name).State(now).String(),
				CooldownSeconds: cd.Seconds(),
			}
			if st, ok := cd.State(now); ok {
				u.Cooling, u.Requested, u.Applied = string(st.Reason), st.Requested.Seconds(), st.Applied.Seconds()
			}
			out = append(out, u)
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
	ups := make(map[string]bool, len(rt.Upstreams))
	creds := make(map[string]bool, len(rt.Upstreams))
	for _, up := range rt.Upstreams {
		ups[up.Name], creds[up.CredKey] = true, true
	}
	s.health.Forget(func(name string) bool { return ups[name] }, func(c string) bool { return creds[c] })
}
