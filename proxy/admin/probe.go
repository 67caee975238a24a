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
	// Breaker and CoolingUntil are the upstream's health after the probe, and
	// Cooldown the cooldown of its credential in force after it.
	Breaker      string     `json:"breaker"`
	CoolingUntil *time.Time `json:"cooling_until,omitempty"`
	Cooldown     *Cooldown  `json:"cooldown,omitempty"`
	// Cleared is true when the probe ended a billing cooldown and the credential is
	// back in candidacy; a 429 turns it into a rate cooldown instead (Cooldown).
	Cleared bool `json:"cleared,omitempty"`
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
// credential, and records the answer in its health as a request's would be: a billing
// answer relearns the billing cooldown, another 429 the rate cooldown (ending a
// billing one: the account answers again), a 5xx or an unreachable upstream counts
// against its breaker, and any other answer ends a billing cooldown. It is served on
// the admin listener, behind its authentication, and a replica sends it on its own
// when a billing cooldown's interval has passed.
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
	b, cd := t.Health.Breaker(name), t.Health.Cooldown(up.CredKey)
	if err != nil {
		res.Error = err.Error()
		b.Record(now, health.Failure)
	} else {
		answer, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		_ = resp.Body.Close()
		res.Status = resp.StatusCode
		res.Cleared = t.record(resp, answer, now)
	}
	res.Breaker = b.State(now).String()
	if c, ok := cd.State(now); ok {
		res.Cooldown = cooldownOf(c)
		if now.Before(c.Until) {
			res.CoolingUntil = &c.Until
		}
	}
	return res, nil
}

// record records a probe's answer in the upstream's health; it reports whether the
// answer cleared a billing cooldown.
func (t ProbeTarget) record(resp *http.Response, answer []byte, now time.Time) bool {
	up, name := t.Up, t.Config.Name
	b, cd := t.Health.Breaker(name), t.Health.Cooldown(up.CredKey)
	code := resp.StatusCode
	if bcode, msg, billing := health.Billing(code, answer); billing {
		iv := cd.BillAnswer(name, bcode, msg, resp.Header, now, up.BillingCooldown)
		t.Log.Warn("Upstream credential on a billing cooldown after a probe: the provider account is out of credit", "upstream", name,
			"status", code, "code", bcode, "message", msg, "requested", iv.Requested, "applied", iv.Applied, "source", iv.Source)
		return false
	}
	switch {
	case code == http.StatusTooManyRequests:
		// The account answers, under rate pressure: a billing cooldown ends (for the
		// fleet too), and the credential stays out on a rate cooldown: not cleared.
		cd.Clear(now)
		iv := health.CooldownFor(resp.Header, now)
		cd.Rate(now, iv, name)
		t.Log.Warn("Upstream credential cooling down after a probe's 429", "upstream", name,
			"requested", iv.Requested, "applied", iv.Applied, "source", iv.Source, "clamped", iv.Clamped)
		return false
	case code >= 500:
		b.Record(now, health.Failure)
		return false
	}
	b.Record(now, health.Success)
	if cd.Clear(now) {
		t.Log.Info("A probe ended the billing cooldown of an upstream's credential", "upstream", name, "status", code)
		return true
	}
	return false
}

// Cooldown is a credential's cooldown in force, as the admin endpoints show it.
type Cooldown struct {
	// Reason is rate (a 429 of rate pressure) or billing (the provider account is out
	// of credit: it holds past Until, until a probe finds the account answering).
	Reason string    `json:"reason"`
	Since  time.Time `json:"since"`
	Until  time.Time `json:"until"`
	// RequestedSeconds is what the provider's answer asked for (0: it gave no
	// timing), AppliedSeconds the interval applied, and Source where it came from.
	RequestedSeconds float64 `json:"requested_seconds"`
	AppliedSeconds   float64 `json:"applied_seconds"`
	Source           string  `json:"source,omitempty"`
	// Upstream is the upstream whose answer started it; Code and Message the
	// provider's, for billing.
	Upstream string `json:"upstream,omitempty"`
	Code     string `json:"code,omitempty"`
	Message  string `json:"message,omitempty"`
}

// cooldownOf is c as the admin endpoints show it.
func cooldownOf(c health.Cooling) *Cooldown {
	return &Cooldown{Reason: string(c.Reason), Since: c.Since, Until: c.Until,
		RequestedSeconds: c.Requested.Seconds(), AppliedSeconds: c.Applied.Seconds(), Source: string(c.Source),
		Upstream: c.Upstream, Code: c.Code, Message: c.Message}
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
