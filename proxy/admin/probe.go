// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package admin

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/proxy/config"
	"github.com/tokenwarden/tokenwarden/proxy/health"
	"github.com/tokenwarden/tokenwarden/proxy/upstream"
)

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

// ProbeTarget is what a probe takes: the upstream and its config, the model to ask
// for, and what the probe is sent and recorded with.
type ProbeTarget struct {
	Up        *upstream.Upstream
	Config    config.Upstream
	Model     string
	Transport http.RoundTripper
	Health    *health.Registry
	Clock     budget.Clock
	Log       *slog.Logger
}

// Probe sends one upstream a one-token call of the first model it serves, with its
// credential, and records the answer in its health as a request's would be: a 429
// relearns the cooldown, a 5xx or an unreachable upstream counts against its
// breaker. It is served on the admin listener, behind its authentication.
func Probe(ctx context.Context, t ProbeTarget) (ProbeResult, error) {
	uc, up, name, model := t.Config, t.Up, t.Config.Name, t.Model
	path, body := "/v1/chat/completions", `{"model":%q,"max_tokens":1,"messages":[{"role":"user","content":"ping"}]}`
	if uc.Provider == config.ProviderAnthropic {
		path = "/v1/messages"
	}
	target := strings.TrimSuffix(up.Target.String(), "/") + path
	ctx, cancel := context.WithTimeout(ctx, time.Duration(uc.TimeoutSeconds)*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, target, bytes.NewReader(fmt.Appendf(nil, body, model)))
	if err != nil {
		return ProbeResult{}, err
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
	began := t.Clock.Now()
	resp, err := t.Transport.RoundTrip(req)
	now := t.Clock.Now()
	res.LatencyMs = now.Sub(began).Milliseconds()
	b := t.Health.Breaker(name)
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
			t.Health.Cooldown(up.CredKey).Start(now, iv.Applied)
			t.Log.Warn("Upstream credential cooling down after a probe's 429", "upstream", name,
				"requested", iv.Requested, "applied", iv.Applied, "source", iv.Source, "clamped", iv.Clamped)
		case resp.StatusCode >= 500:
			b.Record(now, health.Failure)
		default:
			b.Record(now, health.Success)
		}
	}
	res.Breaker = b.State(now).String()
	if until := t.Health.Cooldown(up.CredKey).Until(); now.Before(until) {
		res.CoolingUntil = &until
	}
	return res, nil
}

// Target is the upstream named of a config and the model to probe it with: the
// first registry model it serves (under its provider's name), else the first of its
// own models list.
func Target(cfg *config.Config, ups []*upstream.Upstream, name string) (ProbeTarget, error) {
	i := slices.IndexFunc(cfg.Upstreams, func(u config.Upstream) bool { return u.Name == name })
	if i < 0 {
		return ProbeTarget{}, &Refused{Status: http.StatusNotFound, Msg: fmt.Sprintf("no upstream is named %q", name)}
	}
	uc := cfg.Upstreams[i]
	model := ""
	for _, m := range cfg.Models {
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
		return ProbeTarget{}, &Refused{Status: http.StatusConflict,
			Msg: fmt.Sprintf("upstream %q serves no named model to probe with: name it in a model's upstreams", name)}
	}
	return ProbeTarget{Up: ups[i], Config: uc, Model: model}, nil
}
