// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package server

import (
	"encoding/json"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
)

// Effective is the config in force as /admin/effective shows it: no key material, only
// key names and the resolved allowances.
type Effective struct {
	Generation int64              `json:"generation"`
	Digest     string             `json:"digest"`
	LoadedAt   time.Time          `json:"loaded_at"`
	Storage    string             `json:"storage"`
	Divisor    int64              `json:"budget_division_replicas"`
	AuthMode   string             `json:"auth_mode"`
	Upstreams  []EffectiveUpstrm  `json:"upstreams"`
	APIKeys    []EffectiveKey     `json:"api_keys"`
	Limits     []budget.Effective `json:"limits"`
	// Rules are the rule windows in force, with this replica's allowance.
	Rules    []budget.EffectiveRule `json:"rules"`
	Warnings []string               `json:"warnings"`
	// RestartRequired names the fields of this config that differ from the ones the
	// process started with and take effect only at its next restart (listen
	// addresses, storage, how the store reaches Redis); empty when none.
	RestartRequired []string `json:"restart_required"`

	// Models is the model registry with where each value came from (providers_admin.go).
	Models []EffectiveModel `json:"models"`
}

// EffectiveUpstrm is one upstream in /admin/effective.
type EffectiveUpstrm struct {
	Name   string   `json:"name"`
	URL    string   `json:"url"`
	Models []string `json:"models"`
}

// EffectiveKey is one API key in /admin/effective, by name.
type EffectiveKey struct {
	Name   string `json:"name"`
	User   string `json:"user,omitempty"`
	Team   string `json:"team,omitempty"`
	Bypass bool   `json:"bypass,omitempty"`
}

// Effective describes the config in force; ok is false before the first config.
func (s *Server) Effective() (Effective, bool) {
	rt := s.rt.Load()
	if rt == nil {
		return Effective{}, false
	}
	c := rt.cfg
	e := Effective{
		Generation: c.Generation, Digest: rt.digest, LoadedAt: rt.loadedAt,
		Storage: string(c.RateLimiting.Storage), Divisor: rt.policy.Divisor, AuthMode: string(c.Auth.Mode),
		Limits: rt.policy.Effective(), Rules: rt.policy.EffectiveRules(), Warnings: c.Warnings(),
		Upstreams: []EffectiveUpstrm{}, APIKeys: []EffectiveKey{},
		RestartRequired: append([]string{}, rt.restartRequired...),
		Models:          s.effectiveModels(rt),
	}
	for _, u := range c.Upstreams {
		e.Upstreams = append(e.Upstreams, EffectiveUpstrm{Name: u.Name, URL: u.URL, Models: append([]string{}, u.Models...)})
	}
	for _, k := range c.APIKeys {
		e.APIKeys = append(e.APIKeys, EffectiveKey{Name: k.Name, User: k.User, Team: k.Team, Bypass: k.Bypass})
	}
	return e, true
}

// AdminHandler serves /metrics, /healthz, /readyz, /admin/effective, /admin/refusals
// (audit.go), the trust fence's /admin/durable and POST /admin/durable/attest
// (docs/runbooks.md), and an upstream's probe, POST /admin/upstreams/{name}/probe
// (docs/providers.md).
func (s *Server) AdminHandler(g prometheus.Gatherer) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if s.Draining() {
			http.Error(w, "draining: the proxy is stopping", http.StatusServiceUnavailable)
			return
		}
		if !s.Ready() {
			http.Error(w, "no configuration loaded yet", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /admin/effective", func(w http.ResponseWriter, _ *http.Request) {
		e, ok := s.Effective()
		if !ok {
			http.Error(w, "no configuration loaded yet", http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(e)
	})
	mux.HandleFunc("GET /admin/durable", s.durableEpochs)
	mux.HandleFunc("GET /admin/refusals", s.refusalsHandler)
	mux.HandleFunc("POST /admin/durable/attest", s.attest)
	mux.HandleFunc("POST /admin/upstreams/{name}/probe", s.probe)
	return mux
}
