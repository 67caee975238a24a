// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

// Package upstream is where a request goes: the upstreams and the model registry, the
// candidate each attempt goes to, failover and the health it records, the transports
// and the reverse proxy.
package upstream

import (
	"net/http/httputil"
	"net/url"
	"time"

	"github.com/tokenwarden/tokenwarden/proxy/config"
	"github.com/tokenwarden/tokenwarden/proxy/health"
	"github.com/tokenwarden/tokenwarden/proxy/refusal"
	"github.com/tokenwarden/tokenwarden/proxy/schedule"
)

// Upstream is one backend of a config, compiled.
type Upstream struct {
	Name   string
	Target *url.URL
	Proxy  *httputil.ReverseProxy
	// Credential is the upstream's own key, read from auth_header_env at load.
	Credential string
	// Sched orders requests at the upstream's capacity; nil when it declares none, and
	// then nothing waits. SchedOpts are its options, for the server to bind a
	// scheduler kept across reloads.
	Sched     *schedule.Scheduler
	SchedOpts *schedule.Options
	// Provider is the API family the upstream speaks (empty: both); CredKey keeps its
	// credential's cooldown. Breaker and Cooldown are its health, kept across reloads.
	Provider config.Provider
	CredKey  string
	Breaker  *health.Breaker
	Cooldown *health.Cooldown
	// BillingCooldown is how long its credential cools after a billing answer
	// (routing.billing_cooldown_seconds).
	BillingCooldown time.Duration
}

// Serves reports whether the upstream speaks the API family f.
func (u *Upstream) Serves(f refusal.Family) bool {
	switch u.Provider {
	case config.ProviderOpenAI:
		return f == refusal.OpenAI
	case config.ProviderAnthropic:
		return f == refusal.Anthropic
	}
	return true
}

// CredentialKey is what an upstream's cooldown is kept by: its credential.
func CredentialKey(u config.Upstream) string {
	if u.AuthHeaderEnv != "" {
		return "env:" + u.AuthHeaderEnv
	}
	return "upstream:" + u.Name
}
