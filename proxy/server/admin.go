// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package server

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokenwarden/tokenwarden/proxy/admin"
	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/proxy/explain"
)

// The admin endpoints' values (proxy/admin).
type (
	// Effective is the config in force as /admin/effective shows it.
	Effective = admin.Effective
	// EffectiveUpstrm is one upstream in /admin/effective.
	EffectiveUpstrm = admin.EffectiveUpstrm
	// EffectiveKey is one API key in /admin/effective, by name.
	EffectiveKey = admin.EffectiveKey
	// EffectiveModel is one model of the registry in /admin/effective.
	EffectiveModel = admin.EffectiveModel
	// EffectiveValue is a value in force and where it came from.
	EffectiveValue = admin.EffectiveValue
	// EffectiveServer is one upstream of a model in /admin/effective.
	EffectiveServer = admin.EffectiveServer
	// EffectiveRouting is the fleet's routing defaults in /admin/effective.
	EffectiveRouting = admin.EffectiveRouting
	// Cooldown is a credential's cooldown in force in the admin endpoints.
	Cooldown = admin.Cooldown
	// ProbeResult is what POST /admin/upstreams/{name}/probe answers.
	ProbeResult = admin.ProbeResult
	// Attestation is the body of POST /admin/durable/attest.
	Attestation = admin.Attestation
	// AttestResult is the answer of POST /admin/durable/attest.
	AttestResult = admin.AttestResult
)

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
		Models:          admin.Models(c, rt.CatchAll, s.health, s.clock.Now()),
		Routing:         admin.Routing(c),
	}
	for _, u := range c.Upstreams {
		e.Upstreams = append(e.Upstreams, EffectiveUpstrm{Name: u.Name, URL: u.URL, Models: append([]string{}, u.Models...)})
	}
	for _, k := range c.APIKeys {
		e.APIKeys = append(e.APIKeys, EffectiveKey{Name: k.Name, User: k.User, Team: k.Team, Tenant: k.Tenant, Bypass: k.Bypass})
	}
	return e, true
}

// AdminHandler serves the admin endpoints (proxy/admin) on this server, /metrics
// from g, GET /admin/explain (proxy/explain) and POST /admin/cache/purge.
func (s *Server) AdminHandler(g prometheus.Gatherer) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /admin/explain", explain.Handler(s.Explain))
	mux.HandleFunc("POST /admin/cache/purge", s.cachePurge)
	mux.Handle("/", admin.Handler(s, g, s.log))
	return mux
}

// Durable is the store's trust fence (admin.Source); false when it keeps no durable
// counters.
func (s *Server) Durable() (budget.Durable, bool) {
	ds, ok := s.store.(budget.Durable)
	return ds, ok
}

// RestoreCharge is the charge that restores a balance under the config in force
// (admin.Source).
func (s *Server) RestoreCharge(b budget.Balance) (budget.Charge, error) {
	rt := s.rt.Load()
	if rt == nil {
		return budget.Charge{}, &admin.Refused{Status: http.StatusServiceUnavailable, Msg: "no configuration loaded yet"}
	}
	return s.limiter.RestoreCharge(rt.policy, b)
}

// DurableRules are the durable counters of the config in force, with the window that
// holds the present, and what a cached input token counts (recovery.Source); none
// before a config is loaded.
func (s *Server) DurableRules() ([]budget.DurableRule, float64) {
	rt := s.rt.Load()
	if rt == nil {
		return nil, 1
	}
	return s.limiter.DurableRules(rt.policy), rt.policy.CachedWeight()
}

// ProbeTarget is what probing the upstream named takes (admin.Source).
func (s *Server) ProbeTarget(name string) (admin.ProbeTarget, error) {
	rt := s.rt.Load()
	if rt == nil {
		return admin.ProbeTarget{}, &admin.Refused{Status: http.StatusServiceUnavailable, Msg: "no configuration loaded yet"}
	}
	t, err := admin.Target(rt.cfg, rt.Upstreams, name)
	if err != nil {
		return t, err
	}
	t.Transport, t.Health, t.Clock, t.Log = s.transports.Get(t.Config), s.health, s.clock, s.log
	return t, nil
}
