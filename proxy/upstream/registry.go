// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package upstream

import (
	"fmt"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/tokenwarden/tokenwarden/proxy/config"
	"github.com/tokenwarden/tokenwarden/proxy/health"
	"github.com/tokenwarden/tokenwarden/proxy/refusal"
	"github.com/tokenwarden/tokenwarden/proxy/schedule"
	"github.com/tokenwarden/tokenwarden/proxy/tokenize"
)

// Registry is a config's upstreams and model registry, compiled. It is immutable.
type Registry struct {
	Upstreams []*Upstream
	// CatchAll serves the models no upstream lists (nil: none).
	CatchAll *Upstream
	byModel  map[string]*Upstream
	// Models is the model registry by client-facing name; Fallbacks are the rules'
	// fallback models by rule name.
	Models    map[string]*Model
	Fallbacks map[string]string
	// Known are the model names an upstream lists or the registry names.
	Known map[string]bool
}

// Model is one entry of the model registry, compiled.
type Model struct {
	Name string
	// Window and MaxOut are the context window and largest output (0: unchecked).
	Window, MaxOut int64
	// Candidates are the upstreams that serve the model, in order; empty when the
	// model names none in the registry (then it is routed by upstreams[].models).
	Candidates []Candidate
	// Toks count the model's input in tokenizer mode: each candidate's encoding, once
	// each; the largest count is the one reserved and pre-checked.
	Toks []*tokenize.Encoding
	// Clamp: an over-ask is forwarded with its output cap lowered (the admission
	// policy clamp, on a model that accepts a lowered cap), not refused.
	Clamp bool
	// Substitute is the model that serves a request of this one, before any attempt,
	// when every candidate is unavailable (empty: none).
	Substitute string
}

// Candidate is one upstream of a registered model.
type Candidate struct {
	Up *Upstream
	// ProviderModel replaces the model name in the body sent to this upstream.
	ProviderModel string
	// Header is the value of the header naming the upstream that served, made once (a
	// response's header map holds it and nothing changes it).
	Header []string
}

// Env is what compiling a registry takes from the server: the health kept across
// reloads, the transports, and the reverse proxy an upstream forwards with.
type Env struct {
	Health     *health.Registry
	Transports *Transports
	Proxy      func(*Upstream, http.RoundTripper) *httputil.ReverseProxy
}

// Compile builds a validated config's upstreams and registry. It fails only on what
// validation cannot see (an environment variable named by auth_header_env that is not
// set).
func Compile(cfg *config.Config, env Env) (*Registry, error) {
	reg := &Registry{byModel: map[string]*Upstream{}, Known: map[string]bool{}}
	inRegistry := cfg.RegistryUpstreams()
	for i, uc := range cfg.Upstreams {
		up, err := build(i, uc, cfg, env)
		if err != nil {
			return nil, err
		}
		reg.Upstreams = append(reg.Upstreams, up)
		for _, m := range uc.Models {
			reg.byModel[m] = up
			reg.Known[m] = true
		}
		if len(uc.Models) == 0 && reg.CatchAll == nil && !inRegistry[uc.Name] {
			reg.CatchAll = up
		}
	}
	reg.compileModels(cfg)
	return reg, nil
}

// build compiles the upstream upstreams[i].
func build(i int, uc config.Upstream, cfg *config.Config, env Env) (*Upstream, error) {
	target, err := url.Parse(uc.URL)
	if err != nil {
		return nil, fmt.Errorf("upstreams[%d].url: %w", i, err)
	}
	up := &Upstream{Name: uc.Name, Target: target, Provider: uc.Provider, CredKey: CredentialKey(uc), BillingCooldown: cfg.BillingCooldown()}
	up.Breaker, up.Cooldown = env.Health.Breaker(uc.Name), env.Health.Cooldown(up.CredKey)
	if uc.AuthHeaderEnv != "" {
		v, ok := os.LookupEnv(uc.AuthHeaderEnv)
		if !ok {
			return nil, fmt.Errorf("upstreams[%d].auth_header_env: the environment variable %s is not set", i, uc.AuthHeaderEnv)
		}
		up.Credential = strings.TrimSpace(v)
	}
	up.Proxy = env.Proxy(up, env.Transports.Get(uc))
	if uc.Capacity.Enabled() {
		o := schedule.OptionsFor(uc.Capacity, &cfg.Scheduling)
		up.SchedOpts = &o
	}
	return up, nil
}

// compileModels builds the registry's models. It runs after the upstreams are built.
func (reg *Registry) compileModels(cfg *config.Config) {
	reg.Models = make(map[string]*Model, len(cfg.Models))
	reg.Fallbacks = map[string]string{}
	for _, r := range cfg.RateLimiting.Rules {
		if r.FallbackModel != "" {
			reg.Fallbacks[r.Name] = r.FallbackModel
		}
	}
	byName := make(map[string]*Upstream, len(reg.Upstreams))
	for _, up := range reg.Upstreams {
		byName[up.Name] = up
	}
	for i := range cfg.Models {
		m := &cfg.Models[i]
		mr := &Model{Name: m.Name, Window: m.ContextWindow, MaxOut: m.MaxOutputTokens}
		mr.Clamp = m.AcceptsLoweredOutputCap && cfg.Admission(m) == config.AdmitClamp
		mr.Substitute = m.UnavailableFallback
		for _, mu := range m.Upstreams {
			if up := byName[mu.Upstream]; up != nil {
				mr.Candidates = append(mr.Candidates, Candidate{Up: up, ProviderModel: mu.ProviderModel, Header: []string{up.Name}})
			}
		}
		mr.Toks = encodings(m)
		if mr.Window > 0 || mr.MaxOut > 0 || len(mr.Candidates) > 0 || reg.Fallbacks[m.Name] != "" || mr.Toks != nil {
			reg.Models[m.Name] = mr
			reg.Known[m.Name] = true
		}
		if len(mr.Candidates) > 0 {
			// Routed as its first upstream until a candidate is picked by health.
			reg.byModel[m.Name] = mr.Candidates[0].Up
		}
	}
}

// encodings are the distinct encodings of a model's candidates (its own when it has
// none), each built on the first config naming it; nil when it is not in tokenizer
// mode.
func encodings(m *config.Model) []*tokenize.Encoding {
	var out []*tokenize.Encoding
	add := func(name string) {
		if e := tokenize.Get(name); e != nil && !slices.Contains(out, e) {
			out = append(out, e)
		}
	}
	if len(m.Upstreams) == 0 {
		add(m.Tokenizer)
	}
	for k := range m.Upstreams {
		add(m.Encoding(k))
	}
	return out
}

// Route picks the upstream of a model: the one that lists it, else the catch-all. With
// no model (a route without a body), the catch-all or else the first upstream.
func (reg *Registry) Route(model string) *Upstream {
	if up, ok := reg.byModel[model]; ok {
		return up
	}
	if reg.CatchAll != nil {
		return reg.CatchAll
	}
	if model == "" && len(reg.Upstreams) > 0 {
		return reg.Upstreams[0]
	}
	return nil
}

// The limits of a model that a request may not fit, as refusals name them.
const (
	LimitModelOutput   = "max_output_tokens"
	LimitContextWindow = "context_window"
)

// OverLimit is the model's limit that a request of at least in input tokens asking
// for out output tokens cannot fit: more output than the model generates, or input
// plus output over the context window; empty when it fits (or the model sets neither).
// It is the context-window rule, for the pre-check and a budget's fallback alike.
func (m *Model) OverLimit(in, out int64) string {
	switch {
	case m.MaxOut > 0 && out > m.MaxOut:
		return LimitModelOutput
	case m.Window > 0 && in+out > m.Window:
		return LimitContextWindow
	}
	return ""
}

// Room is the largest output a request of at least in input tokens may ask for: what
// the model generates and what its window leaves after the input, whichever is less;
// 0 when the input leaves no room, -1 when the model sets neither limit.
func (m *Model) Room(in int64) int64 {
	room := int64(-1)
	if m.MaxOut > 0 {
		room = m.MaxOut
	}
	if m.Window > 0 {
		left := max(m.Window-in, 0)
		if room < 0 || left < room {
			room = left
		}
	}
	return room
}

// Substitute is the model that serves, before any attempt, a request of m whose every
// candidate is unavailable: m's unavailable_fallback, when it fits the request (at
// least in input tokens, out output tokens asked for) and has a candidate that may
// take it now. ok is false when none does. The substitute's own substitute is never
// followed: a request is substituted once.
func (reg *Registry) Substitute(m *Model, in, out int64, f refusal.Family, now time.Time) (sub *Model, up *Upstream, ok bool) {
	sub = reg.Models[m.Substitute]
	if sub == nil || len(sub.Candidates) == 0 {
		return nil, nil, false
	}
	if up, ok = sub.takes(in, out, f, now); !ok {
		return nil, nil, false
	}
	return sub, up, true
}

// Fallback is where a request a rule's budget refused may go instead: the rule's
// fallback model, when it is another model, fits the request (at least in input
// tokens, out output tokens asked for) and has an upstream that may take it now. m is
// the fallback's registry entry when it has candidates (its failover state), and ok
// is false when no fallback serves.
func (reg *Registry) Fallback(rule, from string, in, out int64, f refusal.Family, now time.Time) (to string, m *Model, up *Upstream, ok bool) {
	to = reg.Fallbacks[rule]
	if to == "" || to == from {
		return "", nil, nil, false
	}
	mr := reg.Models[to]
	if mr != nil && len(mr.Candidates) > 0 {
		if up, ok = mr.takes(in, out, f, now); !ok {
			return "", nil, nil, false
		}
		return to, mr, up, up != nil
	}
	if mr != nil && mr.OverLimit(in, out) != "" {
		return "", nil, nil, false
	}
	up = reg.Route(to)
	return to, nil, up, up != nil
}

// takes is the upstream of m's first candidate that may take a request now, before
// any attempt, when m fits it (at least in input tokens, out output tokens asked
// for); ok is false when it does not fit or no candidate may take it.
func (m *Model) takes(in, out int64, f refusal.Family, now time.Time) (up *Upstream, ok bool) {
	if m.OverLimit(in, out) != "" {
		return nil, false
	}
	i, _, _ := m.Pick(0, f, now, false)
	if i < 0 {
		return nil, false
	}
	return m.Candidates[i].Up, true
}
