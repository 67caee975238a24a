// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package server

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/tokenwarden/tokenwarden/proxy/config"
	"github.com/tokenwarden/tokenwarden/proxy/health"
	"github.com/tokenwarden/tokenwarden/proxy/upstream"
)

// EffectiveModel is one model of the registry in /admin/effective: each value with
// where it came from (a field of the document, or a default).
type EffectiveModel struct {
	Name            string         `json:"name"`
	ContextWindow   EffectiveValue `json:"context_window"`
	MaxOutputTokens EffectiveValue `json:"max_output_tokens"`
	Price           EffectiveValue `json:"price"`
	// Tokenizer is the encoding that counts the model's input; absent when the
	// estimate does.
	Tokenizer *EffectiveValue   `json:"tokenizer,omitempty"`
	Upstreams []EffectiveServer `json:"upstreams"`
}

// EffectiveValue is a value in force and the field or default it came from.
type EffectiveValue struct {
	Value any    `json:"value"`
	From  string `json:"from"`
}

// EffectiveServer is one upstream of a model, in the order it is tried, with its
// health now.
type EffectiveServer struct {
	Upstream string `json:"upstream"`
	URL      string `json:"url"`
	// Provider is the upstream's API family, empty when it speaks both.
	Provider string `json:"provider,omitempty"`
	// ProviderModel is the model name sent upstream.
	ProviderModel string `json:"provider_model"`
	From          string `json:"from"`
	// Breaker is closed, open or half_open; CoolingUntil is set while the
	// credential cools after a 429. Both are this replica's.
	Breaker      string     `json:"breaker"`
	CoolingUntil *time.Time `json:"cooling_until,omitempty"`
}

// effectiveModels is the registry in force: every model of models, then every model
// only an upstream's models list names.
func (s *Server) effectiveModels(rt *runtime) []EffectiveModel {
	c := rt.cfg
	now := s.clock.Now()
	out := []EffectiveModel{}
	idx := map[string]int{}
	for i, u := range c.Upstreams {
		idx[u.Name] = i
	}
	server := func(up config.Upstream, model, providerModel, from string) EffectiveServer {
		e := EffectiveServer{Upstream: up.Name, URL: up.URL, Provider: string(up.Provider), ProviderModel: model, From: from,
			Breaker: s.health.Breaker(up.Name).State(now).String()}
		if providerModel != "" {
			e.ProviderModel = providerModel
		}
		if until := s.health.Cooldown(upstream.CredentialKey(up)).Until(); now.Before(until) {
			e.CoolingUntil = &until
		}
		return e
	}
	routed := func(name string) []EffectiveServer {
		for i, u := range c.Upstreams {
			if slices.Contains(u.Models, name) {
				return []EffectiveServer{server(u, name, "", fmt.Sprintf("upstreams[%d].models", i))}
			}
		}
		if up := rt.CatchAll; up != nil {
			i := idx[up.Name]
			return []EffectiveServer{server(c.Upstreams[i], name, "", fmt.Sprintf("upstreams[%d] (the catch-all: its models list is empty)", i))}
		}
		return []EffectiveServer{}
	}
	value := func(v int64, field, unset string) EffectiveValue {
		if v > 0 {
			return EffectiveValue{Value: v, From: field}
		}
		return EffectiveValue{Value: nil, From: unset}
	}
	named := map[string]bool{}
	for i, m := range c.Models {
		f := fmt.Sprintf("models[%d]", i)
		named[m.Name] = true
		e := EffectiveModel{Name: m.Name,
			ContextWindow:   value(m.ContextWindow, f+".context_window", "unset: not pre-checked"),
			MaxOutputTokens: value(m.MaxOutputTokens, f+".max_output_tokens", "unset: not checked"),
			Price:           EffectiveValue{From: "unset: no cost budget may govern it"},
		}
		if m.Price != nil {
			e.Price = EffectiveValue{Value: m.Price, From: f + ".price"}
		}
		if m.Tokenizer != "" {
			e.Tokenizer = &EffectiveValue{Value: m.Tokenizer, From: f + ".tokenizer"}
		}
		if m.Registered() {
			for k, mu := range m.Upstreams {
				e.Upstreams = append(e.Upstreams, server(c.Upstreams[idx[mu.Upstream]], m.Name, mu.ProviderModel, fmt.Sprintf("%s.upstreams[%d]", f, k)))
			}
		} else {
			e.Upstreams = routed(m.Name)
		}
		out = append(out, e)
	}
	for _, u := range c.Upstreams {
		for _, name := range u.Models {
			if named[name] {
				continue
			}
			named[name] = true
			out = append(out, EffectiveModel{Name: name,
				ContextWindow:   EffectiveValue{From: "unset: not in models, not pre-checked"},
				MaxOutputTokens: EffectiveValue{From: "unset: not in models"},
				Price:           EffectiveValue{From: "unset: not in models"},
				Upstreams:       routed(name)})
		}
	}
	return out
}

// ProbeResult is what POST /admin/upstreams/{name}/probe answers.
type ProbeResult struct {
	Upstream string `json:"upstream"`
	Model    string `json:"model"`
	// Status is the upstream's HTTP status; 0 when it could not be reached.
	Status    int    `json:"status"`
	Error     string `json:"error,omitempty"`
	LatencyMs int64  `json:"latency_ms"`
	// Breaker and CoolingUntil are the upstream's health after the probe.
	Breaker      string     `json:"breaker"`
	CoolingUntil *time.Time `json:"cooling_until,omitempty"`
}

// probe sends one upstream a one-token call of the first model it serves, with its
// credential, and records the answer in its health as a request's would be: a 429
// relearns the cooldown, a 5xx or an unreachable upstream counts against its
// breaker. It is served on the admin listener, behind its authentication.
func (s *Server) probe(w http.ResponseWriter, r *http.Request) {
	rt := s.rt.Load()
	if rt == nil {
		http.Error(w, "no configuration loaded yet", http.StatusServiceUnavailable)
		return
	}
	name := r.PathValue("name")
	i := slices.IndexFunc(rt.cfg.Upstreams, func(u config.Upstream) bool { return u.Name == name })
	if i < 0 {
		http.Error(w, fmt.Sprintf("no upstream is named %q", name), http.StatusNotFound)
		return
	}
	uc := rt.cfg.Upstreams[i]
	up := rt.Upstreams[i]
	model := ""
	for _, m := range rt.cfg.Models {
		if k := slices.IndexFunc(m.Upstreams, func(mu config.ModelUpstream) bool { return mu.Upstream == name }); k >= 0 {
			model = m.Name
			if pm := m.Upstreams[k].ProviderModel; pm != "" {
				model = pm
			}
			break
		}
	}
	if model == "" && len(uc.Models) > 0 {
		model = uc.Models[0]
	}
	if model == "" {
		http.Error(w, fmt.Sprintf("upstream %q serves no named model to probe with: name it in a model's upstreams", name), http.StatusConflict)
		return
	}
	path, body := "/v1/chat/completions", `{"model":%q,"max_tokens":1,"messages":[{"role":"user","content":"ping"}]}`
	if uc.Provider == config.ProviderAnthropic {
		path = "/v1/messages"
	}
	target := strings.TrimSuffix(up.Target.String(), "/") + path
	ctx, cancel := context.WithTimeout(r.Context(), time.Duration(uc.TimeoutSeconds)*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, target, bytes.NewReader(fmt.Appendf(nil, body, model)))
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	req.Header.Set("Content-Type", "application/json")
	if up.Credential != "" {
		if uc.Provider == config.ProviderAnthropic {
			req.Header.Set("X-Api-Key", up.Credential)
			req.Header.Set("Anthropic-Version", "2023-06-01")
		} else {
			req.Header.Set("Authorization", "Bearer "+up.Credential)
		}
	}
	res := ProbeResult{Upstream: name, Model: model}
	began := s.clock.Now()
	resp, err := s.transports.Get(uc).RoundTrip(req)
	now := s.clock.Now()
	res.LatencyMs = now.Sub(began).Milliseconds()
	b := s.health.Breaker(name)
	switch {
	case err != nil:
		res.Error = err.Error()
		b.Record(now, health.Failure)
	default:
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
		_ = resp.Body.Close()
		res.Status = resp.StatusCode
		switch {
		case resp.StatusCode == http.StatusTooManyRequests:
			iv := health.CooldownFor(resp.Header, now)
			s.health.Cooldown(up.CredKey).Start(now, iv.Applied)
			s.log.Warn("Upstream credential cooling down after a probe's 429", "upstream", name,
				"requested", iv.Requested, "applied", iv.Applied, "source", iv.Source, "clamped", iv.Clamped)
		case resp.StatusCode >= 500:
			b.Record(now, health.Failure)
		default:
			b.Record(now, health.Success)
		}
	}
	res.Breaker = b.State(now).String()
	if until := s.health.Cooldown(up.CredKey).Until(); now.Before(until) {
		res.CoolingUntil = &until
	}
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(res)
}

// ReportedHealth is one upstream's health in the replica's report to the control
// plane (report.UpstreamHealthAnnotation).
type ReportedHealth struct {
	Upstream string `json:"upstream"`
	// Breaker is closed, open or half_open.
	Breaker string `json:"breaker"`
	// Cooling is true while the upstream's credential cools after a 429.
	Cooling bool `json:"cooling,omitempty"`
}

// HealthReport is the model registry's upstreams' health as this replica sees it, as
// JSON for its report Lease; "" without a registry.
func (s *Server) HealthReport() string {
	rt := s.rt.Load()
	if rt == nil {
		return ""
	}
	now := s.clock.Now()
	var out []ReportedHealth
	for _, u := range s.upstreamHealth() {
		i := slices.IndexFunc(rt.Upstreams, func(up *upstream.Upstream) bool { return up.Name == u.Upstream })
		out = append(out, ReportedHealth{Upstream: u.Upstream, Breaker: u.State,
			Cooling: i >= 0 && s.health.Cooldown(rt.Upstreams[i].CredKey).Cooling(now)})
	}
	if len(out) == 0 {
		return ""
	}
	b, err := json.Marshal(out)
	if err != nil {
		return ""
	}
	return string(b)
}
