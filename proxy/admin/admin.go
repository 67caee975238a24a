// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

// Package admin is the admin listener's endpoints: metrics, health and readiness, the
// config in force, the refusal audit, the trust fence's epochs and attestation, and an
// upstream's probe.
package admin

import (
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/tokenwarden/tokenwarden/proxy/accesslog"
	"github.com/tokenwarden/tokenwarden/proxy/budget"
)

// Source is what the endpoints read and act on: the data plane.
type Source interface {
	// Ready reports whether a config is in force; Draining whether the proxy stops.
	Ready() bool
	Draining() bool
	// Effective describes the config in force; false before the first one.
	Effective() (Effective, bool)
	// Refusals are the last refusals of the key named (every key's when all).
	Refusals(key string, all bool) []accesslog.KeyRefusals
	// Durable is the store's trust fence; false when the store keeps no durable
	// counters.
	Durable() (budget.Durable, bool)
	// RestoreCharge is the charge that restores a balance under the config in force.
	RestoreCharge(b budget.Balance) (budget.Charge, error)
	// ProbeTarget is what probing the upstream named takes (Probe); an error is a
	// *Refused.
	ProbeTarget(name string) (ProbeTarget, error)
}

// Refused is a request the admin endpoints cannot serve: its status and message.
type Refused struct {
	Status int
	Msg    string
}

func (r *Refused) Error() string { return r.Msg }

// Handler serves /metrics (from g), /healthz, /readyz, /admin/effective,
// /admin/refusals, the trust fence's /admin/durable and POST /admin/durable/attest
// (docs/runbooks.md), and an upstream's probe, POST /admin/upstreams/{name}/probe
// (docs/providers.md).
func Handler(src Source, g prometheus.Gatherer, log *slog.Logger) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if src.Draining() {
			http.Error(w, "draining: the proxy is stopping", http.StatusServiceUnavailable)
			return
		}
		if !src.Ready() {
			http.Error(w, "no configuration loaded yet", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /admin/effective", func(w http.ResponseWriter, r *http.Request) {
		e, ok := src.Effective()
		if !ok {
			http.Error(w, "no configuration loaded yet", http.StatusServiceUnavailable)
			return
		}
		e = scopeEffective(r.Context(), e)
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(e)
	})
	mux.HandleFunc("GET /admin/durable", func(w http.ResponseWriter, r *http.Request) { durableEpochs(src, w, r) })
	mux.HandleFunc("GET /admin/refusals", func(w http.ResponseWriter, r *http.Request) { refusals(src, w, r) })
	mux.HandleFunc("POST /admin/durable/attest", func(w http.ResponseWriter, r *http.Request) { attest(src, log, w, r) })
	mux.HandleFunc("POST /admin/upstreams/{name}/probe", func(w http.ResponseWriter, r *http.Request) { probe(src, w, r) })
	return mux
}

// refusals serves GET /admin/refusals: every key's last refusals, or with
// ?api_key=NAME one key's (?api_key= alone: the anonymous callers').
func refusals(src Source, w http.ResponseWriter, r *http.Request) {
	name, one := r.URL.Query()["api_key"]
	var key string
	if one && len(name) > 0 {
		key = name[0]
	}
	out := scopeRefusals(r.Context(), src.Refusals(key, !one))
	if one && len(out) == 0 {
		out = append(out, accesslog.KeyRefusals{APIKey: key, Refusals: []accesslog.AuditedRefusal{}})
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(map[string]any{"api_keys": out})
}

// probe serves POST /admin/upstreams/{name}/probe.
func probe(src Source, w http.ResponseWriter, r *http.Request) {
	t, err := src.ProbeTarget(r.PathValue("name"))
	if err != nil {
		refused(w, err)
		return
	}
	res, err := Probe(r.Context(), t)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(res)
}

// refused answers an error of the Source: its status, or 500.
func refused(w http.ResponseWriter, err error) {
	var r *Refused
	if errors.As(err, &r) {
		http.Error(w, r.Msg, r.Status)
		return
	}
	http.Error(w, err.Error(), http.StatusInternalServerError)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}
