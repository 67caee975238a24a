// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package server

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/netip"
	"strings"
	"time"

	"github.com/tokenwarden/tokenwarden/proxy/agentlimit"
	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/proxy/cache"
	"github.com/tokenwarden/tokenwarden/proxy/config"
	"github.com/tokenwarden/tokenwarden/proxy/schedule"
	"github.com/tokenwarden/tokenwarden/proxy/upstream"
)

// runtime is one config compiled for the request path. It is immutable: a reload
// builds a new one and swaps it in, and a request keeps the one it started with.
type runtime struct {
	cfg       *config.Config
	digest    string
	policy    *budget.Policy
	keys      map[[sha256.Size]byte]*budget.KeyPolicy
	authMode  config.AuthMode
	trusted   []netip.Prefix
	whitelist []netip.Prefix
	// clientIPv6Prefix is the prefix length that makes one per_client identity of IPv6
	// addresses.
	clientIPv6Prefix int
	maxBody          int64
	// retryPatience is the longest Retry-After a client is told to wait for; a longer
	// one comes with x-should-retry: false.
	retryPatience time.Duration
	// Registry is the upstreams and the model registry (proxy/upstream).
	upstream.Registry
	// keySched holds the priority class, weight and limits for agents of each key that
	// sets one, by key name; the others have defaultSched (sched).
	keySched map[string]keySched
	// classLimits are each class's bounds, by schedule.Class.
	classLimits [len(schedule.Classes)]config.ClassLimits
	// knownModels are the model names the config mentions: the usage metrics' label set.
	knownModels map[string]bool
	// tokenizes: a model of the registry names a tokenizer, so a charged body's
	// estimate keeps its view for it.
	tokenizes bool
	// fingerprintScopes are each key's scope string under the response cache's api_key
	// scope (cache.ScopeFor), under which its requests' fingerprint is taken: built
	// once, when a rule reads the fingerprint.
	fingerprintScopes map[*budget.KeyPolicy]string
	// restartRequired are the fields this config changed that take effect only at the
	// next restart (never nil).
	restartRequired []string
	loadedAt        time.Time
	generation      int64
}

// keySched is what the scheduler knows of an API key.
type keySched struct {
	class  schedule.Class
	weight float64
	// limits are the key's limits for agents.
	limits agentlimit.Key
}

// defaultSched is a key's when it sets none: interactive, of weight 1, without limits
// for agents, as most of a large fleet's keys are.
var defaultSched = keySched{class: schedule.Interactive, weight: 1}

// schedOf is what the scheduler knows of k.
func schedOf(k *config.APIKey) keySched {
	class, _ := schedule.ParseClass(cmp.Or(k.Priority, config.PriorityInteractive))
	return keySched{class: class, weight: cmp.Or(k.Weight, 1),
		limits: agentlimit.Key{MaxInFlight: k.MaxInFlight, RunTokens: k.RunTokenBudget, RunSteps: k.RunMaxSteps}}
}

// sched is what the scheduler knows of the key of this name.
func (rt *runtime) sched(name string) keySched {
	if ks, ok := rt.keySched[name]; ok {
		return ks
	}
	return defaultSched
}

// compile turns a validated config into a runtime. It fails only on what validation
// cannot see (an environment variable named by auth_header_env that is not set).
func (s *Server) compile(cfg *config.Config, digest string) (*runtime, error) {
	rt := &runtime{
		cfg:              cfg,
		digest:           digest,
		policy:           budget.NewPolicy(cfg),
		keys:             make(map[[sha256.Size]byte]*budget.KeyPolicy, len(cfg.APIKeys)),
		authMode:         cfg.Auth.Mode,
		clientIPv6Prefix: cfg.RateLimiting.ClientIPv6Prefix,
		maxBody:          cfg.MaxBodyBytes,
		retryPatience:    cfg.RetryPatience(),
		keySched:         map[string]keySched{},
		knownModels:      map[string]bool{},
		loadedAt:         s.clock.Now(),
		generation:       cfg.Generation,
	}
	if rt.policy.Reads().Has(budget.AttrFingerprint) {
		rt.fingerprintScopes = make(map[*budget.KeyPolicy]string, len(cfg.APIKeys))
	}
	for i := range cfg.APIKeys {
		k := &cfg.APIKeys[i]
		var h [sha256.Size]byte
		if _, err := hex.Decode(h[:], []byte(k.KeySHA256)); err != nil {
			return nil, fmt.Errorf("api_keys %s: key_sha256: %w", k.Name, err)
		}
		kp := rt.policy.Key(k.Name)
		rt.keys[h] = kp
		if rt.fingerprintScopes != nil {
			if scope, ok := cache.ScopeFor(cache.ScopeAPIKey, k.Name, k.Team); ok {
				rt.fingerprintScopes[kp] = scope
			}
		}
		// A key that sets none takes no entry: a large fleet's are most of them.
		if ks := schedOf(k); ks != defaultSched {
			rt.keySched[k.Name] = ks
		}
	}
	for _, c := range schedule.Classes {
		rt.classLimits[c] = *cfg.Scheduling.Classes.Of(c.String())
	}
	for _, p := range cfg.Auth.TrustedProxies {
		pf, _ := config.ParsePrefix(p)
		rt.trusted = append(rt.trusted, pf)
	}
	for _, p := range cfg.RateLimiting.Whitelist {
		pf, _ := config.ParsePrefix(p)
		rt.whitelist = append(rt.whitelist, pf)
	}
	reg, err := upstream.Compile(cfg, upstream.Env{Health: s.health, Transports: &s.transports, Proxy: s.newReverseProxy})
	if err != nil {
		return nil, err
	}
	rt.Registry = *reg
	for _, mr := range reg.Models {
		rt.tokenizes = rt.tokenizes || mr.Toks != nil
	}
	for m := range reg.Known {
		rt.knownModels[m] = true
	}
	for m := range cfg.RateLimiting.Limits.PerModel {
		rt.knownModels[m] = true
	}
	rt.restartRequired = s.restart.required(cfg)
	return rt, nil
}

// restartState is what the server knows of the settings it cannot change while it runs.
// It is used under Server.applyMu.
type restartState struct {
	// started is what RestartRequired reads of the config the process built its
	// listeners and store from (the first one applied, unless Options.Started says
	// otherwise): its config.RestartBasis, without its keys.
	started *config.Config
	// overridden are fields a command-line flag sets, which no document changes.
	overridden map[string]bool
	// pending is the list in force, for the log.
	pending []string
}

func newRestartState(o Options) restartState {
	r := restartState{started: config.RestartBasis(o.Started), overridden: map[string]bool{}}
	for _, f := range o.Overridden {
		r.overridden[f] = true
	}
	return r
}

// required lists the fields cfg changed that only a restart applies.
func (r *restartState) required(cfg *config.Config) []string {
	if r.started == nil {
		return []string{}
	}
	out := []string{}
	for _, f := range config.RestartRequired(r.started, cfg) {
		if !r.overridden[f] {
			out = append(out, f)
		}
	}
	return out
}

// applyLive applies what a running process can of a config just swapped in: the bucket
// bound, and whether a shared store falls back to the replica's memory (Options.Memory)
// while Redis is unreachable; and says, in the log and the
// tokenwarden_config_restart_required gauge, what waits for a restart.
func (s *Server) applyLive(rt *runtime, origin string) {
	cfg := rt.cfg
	if s.memory != nil {
		s.memory.SetMaxBuckets(cfg.RateLimiting.MaxBuckets)
	}
	if f, ok := s.store.(interface{ SetFallback(*budget.Memory) }); ok && s.memory != nil {
		if fb := cfg.RateLimiting.Redis.FallbackToMemory; fb == nil || *fb {
			f.SetFallback(s.memory)
		} else {
			f.SetFallback(nil)
		}
	}
	if e, ok := s.store.(interface{ SetEpoch(string) }); ok {
		e.SetEpoch(cfg.RateLimiting.Redis.Epoch)
	}
	r := &s.restart
	if r.started == nil {
		r.started = config.RestartBasis(cfg)
	}
	switch {
	case len(rt.restartRequired) > 0:
		s.log.Warn("Config changes that take effect only at the next restart: restart the proxy to apply them; the rest of the config is in force",
			"origin", origin, "restart_required", rt.restartRequired)
	case len(r.pending) > 0:
		s.log.Info("No config change waits for a restart any more", "origin", origin)
	}
	r.pending = rt.restartRequired
	v := 0.0
	if len(rt.restartRequired) > 0 {
		v = 1
	}
	s.metrics.RestartRequired.Set(v)
}

// clientAddr resolves the client address: the peer, or, when the peer is a trusted
// proxy, the rightmost X-Forwarded-For address that is not itself a trusted proxy.
func (rt *runtime) clientAddr(r *http.Request) netip.Addr {
	ap, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		return netip.Addr{}
	}
	addr := ap.Addr().Unmap()
	if len(rt.trusted) == 0 || !contains(rt.trusted, addr) {
		return addr
	}
	xff := r.Header.Values("X-Forwarded-For")
	for i := len(xff) - 1; i >= 0; i-- {
		parts := strings.Split(xff[i], ",")
		for j := len(parts) - 1; j >= 0; j-- {
			a, err := netip.ParseAddr(strings.TrimSpace(parts[j]))
			if err != nil {
				return addr
			}
			a = a.Unmap()
			if !contains(rt.trusted, a) {
				return a
			}
			addr = a
		}
	}
	return addr
}

// clientIdentity is a client address's per_client identity: an IPv4 address (an
// IPv4-mapped IPv6 one included) is its own, and an IPv6 address is its prefix of
// rate_limiting.client_ipv6_prefix bits ("2001:db8:1:2::/64"), so that a client
// holding a whole /64 is one client, not 2^64 of them. Empty for an invalid address.
// The whitelist still matches the full address.
func (rt *runtime) clientIdentity(addr netip.Addr) string {
	if !addr.IsValid() {
		return ""
	}
	addr = addr.Unmap().WithZone("")
	if addr.Is4() {
		return addr.String()
	}
	bits := rt.clientIPv6Prefix
	if bits < 1 || bits > 128 {
		bits = config.DefaultClientIPv6Prefix
	}
	p, err := addr.Prefix(bits)
	if err != nil {
		return addr.String()
	}
	return p.String()
}

func contains(ps []netip.Prefix, a netip.Addr) bool {
	for _, p := range ps {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// bindSchedulers gives each upstream of rt that declares a capacity its scheduler:
// the one the upstream of that name had, reconfigured, so that a reload keeps what
// is in flight and what waits; or a new one. It runs under applyMu, before rt is
// swapped in.
func (s *Server) bindSchedulers(rt *runtime) {
	if s.schedulers == nil {
		s.schedulers = map[string]*schedule.Scheduler{}
	}
	keep := map[string]bool{}
	for _, up := range rt.Upstreams {
		if up.SchedOpts == nil {
			continue
		}
		keep[up.Name] = true
		if sc := s.schedulers[up.Name]; sc != nil {
			sc.Configure(*up.SchedOpts)
			up.Sched = sc
			continue
		}
		o := *up.SchedOpts
		o.Now = s.clock.Now
		if tc, ok := s.clock.(schedule.TimerClock); ok {
			o.After = tc.After
		}
		o.Observer = s.metrics.QueueObserver(up.Name)
		up.Sched = schedule.New(o)
		s.schedulers[up.Name] = up.Sched
	}
	for name := range s.schedulers {
		if !keep[name] {
			// Requests in flight on it still give their slots back to it.
			delete(s.schedulers, name)
		}
	}
	s.metrics.ForgetUpstreams(func(name string) bool { return keep[name] })
}
