// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

// Package server is the proxy's HTTP data plane: authentication, admission against the
// token and request budgets, forwarding with httputil.ReverseProxy, settlement on the
// usage the backend reports, refusals in each API family's shape, and the admin
// listener. A config is applied through Apply, whatever its source.
package server

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/url"
	goruntime "runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/tokenwarden/tokenwarden/proxy/accesslog"
	"github.com/tokenwarden/tokenwarden/proxy/agentlimit"
	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/proxy/config"
	"github.com/tokenwarden/tokenwarden/proxy/estimate"
	"github.com/tokenwarden/tokenwarden/proxy/health"
	"github.com/tokenwarden/tokenwarden/proxy/metrics"
	"github.com/tokenwarden/tokenwarden/proxy/refusal"
	"github.com/tokenwarden/tokenwarden/proxy/schedule"
)

// route is what the proxy knows of a request path.
type route struct {
	name    string // the metrics label: the charged path, or "other"
	family  refusal.Family
	charged bool
	// stripPrefix is removed from the path before forwarding (/anthropic).
	stripPrefix string
	// path is the canonical escaped path: the one classified, and forwarded.
	path string
}

var chargedRoutes = map[string]route{
	"/v1/chat/completions":   {name: "/v1/chat/completions", family: refusal.OpenAI, charged: true},
	"/v1/completions":        {name: "/v1/completions", family: refusal.OpenAI, charged: true},
	"/v1/responses":          {name: "/v1/responses", family: refusal.OpenAI, charged: true},
	"/v1/responses/compact":  {name: "/v1/responses/compact", family: refusal.OpenAI, charged: true},
	"/v1/messages":           {name: "/v1/messages", family: refusal.Anthropic, charged: true},
	"/anthropic/v1/messages": {name: "/anthropic/v1/messages", family: refusal.Anthropic, charged: true, stripPrefix: "/anthropic"},
}

// classify reads a request path in its canonical form (paths.go): a charged route
// under any spelling that reads as one is that route, forwarded as its own path.
func classify(u *url.URL) route {
	p := canonicalPath(u.EscapedPath())
	if r, ok := chargedRoutes[p]; ok {
		r.path = r.name
		return r
	}
	if alt, ok := readThrough(p); ok {
		if r, ok := chargedRoutes[alt]; ok {
			r.path = r.name
			return r
		}
	}
	switch {
	case strings.HasPrefix(p, "/anthropic/"):
		return route{name: "other", family: refusal.Anthropic, stripPrefix: "/anthropic", path: p}
	case strings.HasPrefix(p, "/v1/messages/"):
		return route{name: "other", family: refusal.Anthropic, path: p}
	}
	return route{name: "other", family: refusal.OpenAI, path: p}
}

// Options configure a Server.
type Options struct {
	// Store keeps the buckets.
	Store budget.Store
	// Memory is the replica-local store (the Store itself, or the fallback of a shared
	// one); a reload applies max_buckets to it.
	Memory *budget.Memory
	// Metrics is required: every request is counted.
	Metrics *metrics.Metrics
	// Clock measures everything about a request, its latencies included (default: the
	// system clock).
	Clock  budget.Clock
	Logger *slog.Logger
	// AsyncSettle is for stores that make a network call: a settlement that waits for
	// the store's answer runs on a detached goroutine (a refund to a store that sends
	// refunds without waiting, budget.RefundSender, does not).
	AsyncSettle bool
	// Started is the config the process built its listeners and store from (default:
	// the first one applied); Overridden are fields a flag sets. A reload that changes
	// another of those fields is reported as restart_required.
	Started    *config.Config
	Overridden []string
	// Refusals, when set, counts each refusal by a budget for the replica's usage
	// report (proxy/report.Refusals); it is called for refused requests only.
	Refusals RefusalCounter
	// AccessLog receives the access log's JSON lines (default os.Stdout), at most
	// AccessLogBuffer of them waiting (default config.DefaultAccessLogBufferLines).
	AccessLog       io.Writer
	AccessLogBuffer int
	// TracerProvider, when set, traces every request (proxy/telemetry).
	TracerProvider trace.TracerProvider
}

// RefusalCounter counts refusals by the dimension and period that refused: d's bucket
// of kind k (Requests, TokensMinute or TokensDay) of limits, model the request's
// model; or a rule's window, by the rule's name and the window's index.
type RefusalCounter interface {
	Refused(d budget.Dimension, k budget.Kind, model string)
	RefusedRule(rule string, window uint8)
}

// Server is the data plane. It is safe for concurrent use; Apply swaps its config.
type Server struct {
	rt         atomic.Pointer[runtime]
	limiter    *budget.Limiter
	store      budget.Store
	memory     *budget.Memory
	metrics    *metrics.Metrics
	clock      budget.Clock
	log        *slog.Logger
	transports transports
	applyMu    sync.Mutex
	restart    restartState
	draining   atomic.Bool
	refusals   RefusalCounter
	// schedulers are the upstreams' schedulers by upstream name, kept across reloads
	// (guarded by applyMu).
	schedulers map[string]*schedule.Scheduler
	// health is the upstreams' breakers and credentials' cooldowns, kept across reloads.
	health *health.Registry
	// agents is the state of the limits for agents (proxy/agentlimit).
	agents agentlimit.Limits
	// access, tracing and audit tell about each request (observe.go, proxy/accesslog);
	// tracing is nil when it is off.
	access  *accesslog.Writer
	tracing *tracing
	audit   accesslog.Audit
}

// New returns a Server with no config; it answers 503 until Apply succeeds.
func New(o Options) *Server {
	if o.Clock == nil {
		o.Clock = budget.SystemClock{}
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	s := &Server{
		store:    o.Store,
		memory:   o.Memory,
		metrics:  o.Metrics,
		clock:    o.Clock,
		log:      o.Logger,
		limiter:  budget.NewLimiter(o.Store, o.Metrics, o.Clock, o.AsyncSettle),
		restart:  newRestartState(o),
		refusals: o.Refusals,
		health:   health.NewRegistry(),
		access:   accesslog.New(o.AccessLog, o.AccessLogBuffer, o.Metrics.Observability),
		tracing:  newTracing(o.TracerProvider, o.Clock),
	}
	o.Metrics.Providers.SetHealthSource(s.upstreamHealth)
	// The access log's writer ends with the server: no request can send to it then.
	goruntime.AddCleanup(s, (*accesslog.Writer).Stop, s.access)
	return s
}

// Apply parses, validates and compiles a config document and swaps it in. A document
// that fails any step is refused and counted, and the config in force stays. Requests
// in flight finish on the config they started with; bucket levels carry over (a reload
// never grants budget), and the buckets of dimensions and keys that are gone are
// dropped.
func (s *Server) Apply(data []byte, origin string) (*config.Config, error) {
	s.applyMu.Lock()
	defer s.applyMu.Unlock()
	digest := config.Digest(data)
	if cur := s.rt.Load(); cur != nil && cur.digest == digest {
		return cur.cfg, nil
	}
	began := time.Now()
	cfg, err := config.Parse(data)
	var rt *runtime
	if err == nil {
		rt, err = s.compile(cfg, digest)
	}
	if err != nil {
		s.metrics.ConfigReloads.WithLabelValues("failure").Inc()
		s.log.Error("Refused a config document; the config in force stays", "origin", origin, "error", err)
		return nil, err
	}
	s.bindSchedulers(rt)
	s.agents.Configure(cfg)
	took := time.Since(began)
	prev := s.rt.Swap(rt)
	s.applyLive(rt, origin)
	s.store.Prune(rt.policy.Keeps)
	s.metrics.ForgetKeys(func(name string) bool { return rt.policy.Key(name) != nil })
	s.observeApply(rt)
	s.metrics.ForgetRules(rt.policy.HasRule)
	s.forgetTeams(cfg)
	s.forgetHealth(rt)
	s.metrics.SetConfig(cfg.Generation, digest, float64(s.clock.Now().Unix()))
	s.metrics.ConfigReloadTime.Set(took.Seconds())
	s.metrics.SetAllowances(rt.policy.Divisor, rt.policy.Effective())
	for _, w := range cfg.Warnings() {
		s.log.Warn("Config warning", "origin", origin, "warning", w)
	}
	s.log.Info("Applied config", "origin", origin, "generation", cfg.Generation, "digest", digest[:12],
		"divisor", rt.policy.Divisor, "storage", cfg.RateLimiting.Storage, "first", prev == nil,
		"keys", len(cfg.APIKeys), "took", took.Round(time.Millisecond))
	return cfg, nil
}

// Ready reports whether a config is in force.
func (s *Server) Ready() bool { return s.rt.Load() != nil }

// holdKey carries the request's state into the reverse proxy's callbacks.
type holdKey struct{}

// exchange is one request's state from admission to settlement.
type exchange struct {
	s        *Server
	rt       *runtime
	route    route
	upstream *upstream
	hold     *budget.Hold
	est      estimate.Estimate
	dec      budget.Decision
	// slot is the request's place in its upstream's capacity, when it has a scheduler.
	slot  schedule.Slot
	agent agentlimit.Request
	key   string
	// try is a registered model's failover state (providers.go).
	try attempt
	// status is the upstream's status, or the proxy's own answer.
	status int
	// rec is what the access log tells of the request; cw counts the bytes sent; span
	// and upSpan are the request's server span and its upstream call's, when traced.
	rec    accesslog.Record
	cw     counter
	span   trace.Span
	upSpan trace.Span

	// settling: the hold was settled, and the store tells the settlement (Settled);
	// arrived counts Settled and observe, the last of which writes the access log line.
	settling bool
	arrived  atomic.Int32
}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rt := s.rt.Load()
	rtInfo := classify(r.URL)
	ex := &exchange{s: s, rt: rt, route: rtInfo}
	// Every latency of the request is measured on the injected clock, from this arrival.
	ex.rec.Start = s.clock.Now()
	ex.cw.ResponseWriter = w
	w = &ex.cw
	r = ex.begin(w, r)
	defer func() {
		// Every path that ends without settlement releases: an upstream error, a panic
		// in a handler, a client that went away. Release after Settle does nothing.
		ex.release()
		s.agents.End(&ex.agent)
		if ex.status == 0 {
			ex.status = http.StatusBadGateway
		}
		ex.rec.Finished = s.clock.Now()
		s.metrics.Requests.WithLabelValues(ex.route.name, metrics.Code(ex.status)).Inc()
		s.metrics.RequestDuration.WithLabelValues(ex.route.name).Observe(ex.rec.Finished.Sub(ex.rec.Start).Seconds())
		ex.rec.BytesIn = max(r.ContentLength, 0)
		s.observe(ex, rt)
	}()
	if rt == nil {
		ex.fail(w, http.StatusServiceUnavailable, "unavailable", "the proxy has no configuration yet", nil)
		return
	}

	// Authentication.
	var key *budget.KeyPolicy
	if presented, ok := credential(r); ok {
		key = rt.keys[sha256.Sum256([]byte(presented))]
		if key == nil {
			ex.fail(w, http.StatusUnauthorized, "authentication", "the API key is not valid", nil)
			return
		}
		ex.key = key.Name
		ex.rec.APIKey, ex.rec.User, ex.rec.Team = key.Name, key.User, key.Team
	} else if rt.authMode == config.AuthRequired {
		ex.fail(w, http.StatusUnauthorized, "authentication", "an API key is required: send it as Authorization: Bearer KEY or x-api-key: KEY", nil)
		return
	}

	// The body: read once, bounded, replayed to the upstream.
	var chargedBody []byte
	if r.Body != nil && r.Body != http.NoBody && (rtInfo.charged || len(rt.upstreams) > 1) {
		body, ok := ex.readBody(w, r, rt.maxBody)
		if !ok {
			return
		}
		if rtInfo.charged {
			if body, ok = ex.decodedBody(w, r, body, rt.maxBody); !ok {
				return
			}
			est, err := estimate.Body(body)
			if err != nil {
				// Nested deeper than any upstream reads: refused as upstreams refuse it.
				ex.fail(w, http.StatusBadRequest, "invalid_request", err.Error(), nil)
				return
			}
			ex.est, chargedBody = est, body
			ex.try.body = body
		} else {
			ex.est.Model = estimate.Model(body)
		}
	}

	ex.upstream = rt.route(ex.est.Model)
	if ex.upstream == nil {
		ex.fail(w, http.StatusNotFound, "model_not_found", fmt.Sprintf("no upstream serves the model %q", ex.est.Model), nil)
		return
	}
	// The model registry: the context-window pre-check, then an upstream that is up.
	if !ex.precheck(w) || !ex.choose(w) {
		return
	}

	if rc := r.Header.Get(retryCountHeader); rc != "" && rc != "0" {
		s.metrics.Agents.Retried(rtInfo.name)
	}

	// The limits for agents, before admission so that what they refuse reserves nothing.
	if !ex.agentLimits(w, r, key, chargedBody) {
		return
	}

	// Admission.
	client := rt.clientAddr(r)
	id := budget.Identity{Key: key, Model: ex.est.Model, Exempt: client.IsValid() && contains(rt.whitelist, client)}
	id.Client = rt.clientIdentity(client)
	var ask budget.Ask
	if rtInfo.charged {
		ask = budget.Ask{Input: ex.est.Input, Output: ex.est.Output}
	}
	actx := r.Context()
	var asp trace.Span
	if s.tracing != nil {
		actx, asp = s.tracing.admission(actx, s.clock.Now())
	}
	dec, err := s.limiter.Admit(actx, rt.policy, id, ask)
	if err == nil && dec.Refusal != nil && len(rt.fallbacks) > 0 {
		dec = ex.fallback(r.Context(), id, ask, dec)
	}
	if err == nil {
		ex.admitted(&id, &dec)
	}
	if asp != nil {
		s.tracing.admitted(asp, ex, err, s.clock.Now())
	}
	if err != nil {
		var unavailable *budget.UnavailableError
		var recovering *budget.RecoveringError
		if errors.As(err, &recovering) {
			w.Header().Set("Retry-After", recoveringRetryAfter)
			ex.fail(w, http.StatusServiceUnavailable, "budget_recovering", recovering.ClientMessage(), nil)
			return
		}
		if errors.As(err, &unavailable) {
			w.Header().Set("Retry-After", "5")
			ex.fail(w, http.StatusServiceUnavailable, "budget_store_unavailable", "the budget store is unreachable; retry later", nil)
			return
		}
		ex.fail(w, http.StatusServiceUnavailable, "budget_store_unavailable", "admission failed: "+err.Error(), nil)
		return
	}
	ex.dec, ex.hold = dec, dec.Hold
	if dec.Refusal != nil {
		if s.refusals != nil {
			kind := dec.Refusal.Period
			if dec.Refusal.Requests {
				kind = budget.Requests
			}
			if dec.Refusal.Rule != "" {
				s.refusals.RefusedRule(dec.Refusal.Rule, dec.Refusal.WindowIndex)
			} else {
				s.refusals.Refused(dec.Refusal.Dimension, kind, id.Model)
			}
		}
		ex.refuse(w, dec.Refusal)
		return
	}

	// Scheduling: an admitted request, holding its reservation, waits for the
	// upstream's capacity (docs/proxy-config.md "Scheduling").
	if sc := ex.upstream.sched; sc != nil && !ex.wait(w, r, sc, key) {
		return
	}

	// The hand-off to the upstream: its latency is measured from here, after any wait
	// for its capacity (the queue wait's own histogram), so the two never overlap.
	ctx := r.Context()
	at := s.clock.Now()
	if s.tracing != nil {
		ctx = s.tracing.upstream(ctx, ex, at)
	}
	ctx = context.WithValue(ctx, holdKey{}, ex)
	ex.forward(w, r.WithContext(ctx), at)
}

// credential reads the client's key from Authorization: Bearer or x-api-key.
func credential(r *http.Request) (string, bool) {
	if h := r.Header.Get("Authorization"); h != "" {
		if len(h) > 7 && strings.EqualFold(h[:7], "bearer ") {
			return strings.TrimSpace(h[7:]), true
		}
		return strings.TrimSpace(h), true
	}
	if k := r.Header.Get("X-Api-Key"); k != "" {
		return strings.TrimSpace(k), true
	}
	return "", false
}

// decodedBody is a charged request's body as the upstream will read it: a gzip or
// deflate body is decoded (bounded by max_body_bytes) for the estimate, so compression
// is no way around it; one in a coding the proxy cannot read is refused with 415, as it
// could not be estimated. It answers the refusal itself and reports false when the request must
// stop.
func (ex *exchange) decodedBody(w http.ResponseWriter, r *http.Request, body []byte, maxBytes int64) ([]byte, bool) {
	codings, ok := contentCodings(r.Header)
	if !ok {
		ex.fail(w, http.StatusUnsupportedMediaType, "invalid_request",
			"the request body's Content-Encoding is not one the proxy reads: send it plain, gzip or deflate", nil)
		return nil, false
	}
	if len(codings) == 0 {
		return body, true
	}
	decoded, err := decodeRequest(body, codings, maxBytes)
	switch {
	case errors.Is(err, errDecodedTooLarge):
		ex.tooLarge(w, maxBytes)
		return nil, false
	case err != nil:
		ex.fail(w, http.StatusBadRequest, "invalid_request", "the request body could not be decoded: "+err.Error(), nil)
		return nil, false
	}
	return decoded, true
}

// readBody reads the whole body, at most max bytes, and replaces r.Body with a replay
// of it. It answers 413 or 400 itself and reports false when the request must stop.
func (ex *exchange) readBody(w http.ResponseWriter, r *http.Request, maxBytes int64) ([]byte, bool) {
	if r.ContentLength > maxBytes {
		ex.tooLarge(w, maxBytes)
		return nil, false
	}
	body, err := readAtMost(r.Body, r.ContentLength, maxBytes+1)
	if int64(len(body)) > maxBytes {
		ex.tooLarge(w, maxBytes)
		return nil, false
	}
	if err != nil {
		ex.fail(w, http.StatusBadRequest, "invalid_request", "the request body could not be read", nil)
		return nil, false
	}
	rb := &replayBody{body: body}
	rb.Reset(body)
	r.Body = rb
	r.ContentLength = int64(len(body))
	r.GetBody = rb.again
	return body, true
}

// readAtMost reads src to its end or to limit bytes, whichever comes first, into one
// buffer sized by the declared length when there is one (plus a byte, to see the end
// without growing). It returns what it read and the error that ended the read, nil at
// the end of src.
func readAtMost(src io.Reader, declared, limit int64) ([]byte, error) {
	size := int64(512)
	if declared > 0 {
		size = declared + 1
	}
	buf := make([]byte, 0, min(size, limit))
	for int64(len(buf)) < limit {
		if len(buf) == cap(buf) {
			buf = slices.Grow(buf, int(min(int64(cap(buf)), limit-int64(len(buf)))))
		}
		room := buf[len(buf):min(int64(cap(buf)), limit)]
		n, err := src.Read(room)
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			return buf, err
		}
	}
	return buf, nil
}

// replayBody is a request body read once and sent from memory, as often as the
// transport asks (GetBody).
type replayBody struct {
	bytes.Reader
	body []byte
}

// Close implements io.Closer; there is nothing to close.
func (*replayBody) Close() error { return nil }

// again is the body from its start, for the transport's GetBody.
func (rb *replayBody) again() (io.ReadCloser, error) {
	next := &replayBody{body: rb.body}
	next.Reset(rb.body)
	return next, nil
}

// wait takes the request's place in its upstream's capacity: at once below it, after a
// wait in the upstream's queue at it. The class is the key's (interactive for
// anonymous requests), lowered by the x-tokenwarden-priority header and never
// raised. A wait that ends without a place answers 429 queue_timeout or queue_full
// with a Retry-After (nothing, when the client went away) and reports false; the
// caller's deferred release then gives the reservation back.
func (ex *exchange) wait(w http.ResponseWriter, r *http.Request, sc *schedule.Scheduler, key *budget.KeyPolicy) bool {
	req := schedule.Request{Class: ex.agent.Class, Weight: 1, Input: ex.est.Input, Output: ex.est.Output, Bytes: max(r.ContentLength, 0)}
	if key != nil {
		req.Tenant, req.Weight = key.Name, ex.rt.keySched[key.Name].weight
	}
	handled, err := ex.acquireAny(r.Context(), req)
	if !handled {
		ex.slot, err = sc.Acquire(r.Context(), req)
	}
	if err == nil {
		return true
	}
	var we *schedule.WaitError
	if !errors.As(err, &we) {
		ex.status = 499 // the client closed the request while it waited
		return false
	}
	secs := int64(math.Ceil(we.RetryAfter.Seconds()))
	ex.rec.Decision, ex.rec.Queue, ex.rec.RetryAfterSecond = accesslog.Refused, true, secs
	h := w.Header()
	h.Set("Retry-After", strconv.FormatInt(secs, 10))
	h.Set("Retry-After-Ms", strconv.FormatInt(we.RetryAfter.Milliseconds(), 10))
	details := map[string]any{"retry_after_seconds": secs, "retryable": true, "class": req.Class.String()}
	code, msg := "queue_timeout", "the request waited for the upstream "+ex.upstream.name+"'s capacity for the longest wait allowed; retry later"
	if errors.Is(err, schedule.ErrQueueFull) {
		code, msg = "queue_full", "the queue for the upstream "+ex.upstream.name+"'s capacity is full; retry later"
	}
	ex.fail(w, http.StatusTooManyRequests, code, msg, &refusal.Body{LimitType: "queue", Details: details})
	return false
}
