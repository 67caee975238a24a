// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

// Package server is the proxy's HTTP data plane: authentication, admission against the
// token and request budgets, forwarding with httputil.ReverseProxy, settlement on the
// usage the backend reports, refusals in each API family's shape, and the admin
// listener. A config is applied through Apply, whatever its source.
package server

import (
	"io"
	"log/slog"
	"net/http"
	"net/url"
	goruntime "runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/tokenwarden/tokenwarden/proxy/accesslog"
	"github.com/tokenwarden/tokenwarden/proxy/agentlimit"
	"github.com/tokenwarden/tokenwarden/proxy/agentlimit/redisagents"
	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/proxy/config"
	"github.com/tokenwarden/tokenwarden/proxy/estimate"
	"github.com/tokenwarden/tokenwarden/proxy/health"
	"github.com/tokenwarden/tokenwarden/proxy/metrics"
	"github.com/tokenwarden/tokenwarden/proxy/refusal"
	"github.com/tokenwarden/tokenwarden/proxy/schedule"
	"github.com/tokenwarden/tokenwarden/proxy/settlement"
	"github.com/tokenwarden/tokenwarden/proxy/upstream"
)

// route is what the proxy knows of a request path.
type route struct {
	name    string // the metrics label: the charged path, or "other"
	family  refusal.Family
	charged bool
	// endpoint is the route family rules select on (config's endpoint words).
	endpoint string
	// stripPrefix is removed from the path before forwarding (/anthropic).
	stripPrefix string
	// path is the canonical escaped path: the one classified, and forwarded.
	path string
}

var chargedRoutes = map[string]route{
	"/v1/chat/completions":   {name: "/v1/chat/completions", family: refusal.OpenAI, charged: true, endpoint: config.EndpointChatCompletions},
	"/v1/completions":        {name: "/v1/completions", family: refusal.OpenAI, charged: true, endpoint: config.EndpointCompletions},
	"/v1/responses":          {name: "/v1/responses", family: refusal.OpenAI, charged: true, endpoint: config.EndpointResponses},
	"/v1/responses/compact":  {name: "/v1/responses/compact", family: refusal.OpenAI, charged: true, endpoint: config.EndpointResponses},
	"/v1/messages":           {name: "/v1/messages", family: refusal.Anthropic, charged: true, endpoint: config.EndpointMessages},
	"/anthropic/v1/messages": {name: "/anthropic/v1/messages", family: refusal.Anthropic, charged: true, endpoint: config.EndpointMessages, stripPrefix: "/anthropic"},
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
		return route{name: "other", family: refusal.Anthropic, stripPrefix: "/anthropic", path: p, endpoint: config.EndpointOther}
	case strings.HasPrefix(p, "/v1/messages/"):
		return route{name: "other", family: refusal.Anthropic, path: p, endpoint: config.EndpointOther}
	}
	return route{name: "other", family: refusal.OpenAI, path: p, endpoint: config.EndpointOther}
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
	// Observers are told of every settled request after the proxy's own (the usage
	// and spend metrics), in order: a ledger is one of them.
	Observers []settlement.Observer
	// HealthBoard, when set, shares the billing cooldowns with the fleet's other
	// replicas (the Redis store's board); RunHealth reads theirs.
	HealthBoard health.Board
	// LedgerAttests says the fleet attests lost durable counters from its spend ledger
	// on its own (a PostgreSQL ledger, run by the control plane): a fenced budget's
	// 503 says so instead of waiting for an administrator.
	LedgerAttests bool
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
	transports upstream.Transports
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
	// observers are told of each settled request, in order (settle.go).
	observers []settlement.Observer
	// refusers are the observers that may ask for a request to be refused (settle.go).
	refusers []settlement.Refuser
	// cache is the response cache in force, nil when it is off (cache.go).
	cache atomic.Pointer[cacheRoom]
	// ledgerAttests is Options.LedgerAttests.
	ledgerAttests bool
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
		store:         o.Store,
		memory:        o.Memory,
		metrics:       o.Metrics,
		clock:         o.Clock,
		log:           o.Logger,
		limiter:       budget.NewLimiter(o.Store, o.Metrics, o.Clock, o.AsyncSettle),
		restart:       newRestartState(o),
		refusals:      o.Refusals,
		ledgerAttests: o.LedgerAttests,
		health:        health.NewRegistry(),
		access:        accesslog.New(o.AccessLog, o.AccessLogBuffer, o.Metrics.Observability),
		tracing:       newTracing(o.TracerProvider, o.Clock),
	}
	// With the Redis store, the limits for agents are the fleet's totals.
	if fl := redisagents.For(o.Store, o.Clock, o.Logger); fl != nil {
		// One fleet's leased slots: a key's max_in_flight and the rules' in-flight windows.
		s.agents.SetFleet(fl)
		s.limiter.SetSlots(fl.(budget.Slots))
	}
	if o.HealthBoard != nil {
		s.health.Share(o.HealthBoard, o.Logger)
	}
	s.observers = s.settlementObservers(o.Observers)
	s.refusers = refusersOf(o.Observers)
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
	s.bindCache(cfg)
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
	s.metrics.SetAllowances(rt.policy.Divisor, rt.policy.Allowances())
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

// exchange is one request's state from its arrival to its access log line. It holds
// the request's state only: what acts on it is the Server's (the stages, stages.go).
type exchange struct {
	rt    *runtime
	route route
	// w is the client's writer (cw, counting), r the request as the stages pass it on.
	w http.ResponseWriter
	r *http.Request
	// key is the API key's policy (nil for an anonymous request); body the charged
	// request's body, decoded.
	key      *budget.KeyPolicy
	body     []byte
	upstream *upstream.Upstream
	hold     *budget.Hold
	est      estimate.Estimate
	dec      budget.Decision
	// slot is the request's place in its upstream's capacity, when it has a scheduler.
	slot  schedule.Slot
	agent agentlimit.Request
	// try is the request's failover state (proxy/upstream).
	try upstream.Attempt
	// status is the upstream's status, or the proxy's own answer; refused says a
	// refusal's limit type when the proxy refused with one (counted as the request
	// ends).
	status  int
	refused string
	// rec is what the access log tells of the request; cw counts the bytes sent; span
	// and upSpan are the request's server span and its upstream call's, when traced.
	rec    accesslog.Record
	cw     counter
	span   trace.Span
	upSpan trace.Span
	// attempts is how many upstreams were handed the request.
	attempts int
	// cache is the request's part in the response cache (cache.go).
	cache cacheState

	// The access log line (observe.go): settling, the hold was settled and the store
	// tells the settlement (Settled); arrived counts Settled and observe, the last of
	// which writes the line to log.
	log      *accesslog.Writer
	settling bool
	// told says the observers were told of its settlement (once).
	told    bool
	arrived atomic.Int32
}

// ServeHTTP implements http.Handler: a request passes the stages in order, and the
// first that refuses it ends it (it has answered). What follows the answer is the
// settlement's (settle.go); the request's record is ended by finish.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	ex := s.arrive(w, r)
	defer s.finish(ex)
	for _, stage := range &stages {
		if !stage(s, ex) {
			return
		}
	}
}
