// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package config

import (
	"fmt"
	"slices"
	"time"
)

// The model registry: each client-facing model in models may declare its context
// window, its largest output and the ordered upstreams that serve it. An upstream
// error before the answer began moves a request to the next upstream of its model;
// these failover lists live only here, and upstreams[].models still lists a model
// under one upstream at most (docs/providers.md).

// Provider is the API family an upstream speaks.
type Provider string

// Providers.
const (
	// ProviderOpenAI speaks the OpenAI API: chat completions, completions, Responses.
	ProviderOpenAI Provider = "openai"
	// ProviderAnthropic speaks the Anthropic Messages API.
	ProviderAnthropic Provider = "anthropic"
)

// ModelUpstream is one upstream of a model in the registry.
type ModelUpstream struct {
	// Upstream is the name of an entry of upstreams: its URL, credential and provider
	// family.
	Upstream string `json:"upstream"`
	// ProviderModel is the provider's own name of the model, sent upstream in place of
	// the client-facing name. Absent: the client-facing name.
	ProviderModel string `json:"provider_model,omitempty"`
	// Tokenizer is the encoding of the provider model behind this upstream, when it
	// differs from the model's tokenizer: o200k_base or cl100k_base. Absent: the
	// model's tokenizer.
	Tokenizer string `json:"tokenizer,omitempty"`
}

// Tokenized reports whether the model is in tokenizer mode: it or one of its
// upstreams names an encoding. Its input is then counted with each candidate's
// encoding, and the largest count is reserved and pre-checked.
func (m *Model) Tokenized() bool {
	return m.Tokenizer != "" || slices.ContainsFunc(m.Upstreams, func(mu ModelUpstream) bool { return mu.Tokenizer != "" })
}

// Encoding is the encoding that counts the input of the model's k-th upstream: its
// own, else the model's; empty when neither names one.
func (m *Model) Encoding(k int) string {
	if t := m.Upstreams[k].Tokenizer; t != "" {
		return t
	}
	return m.Tokenizer
}

// Health timing of the upstreams: when a breaker opens and for how long, and how long
// a credential cools after a 429. Fixed, but for a billing cooldown's interval
// (routing.billing_cooldown_seconds, within its bounds).
const (
	// BreakerMinCalls is the number of recorded calls a breaker needs before it may open.
	BreakerMinCalls = 5
	// BreakerOpenFor is how long an open breaker keeps its upstream out of candidacy.
	BreakerOpenFor = 10 * time.Second
	// BreakerProbes is the number of half-open probes that close a breaker again.
	BreakerProbes = 3
	// DefaultCooldown is a credential's cooldown after a 429 that carries no timing.
	DefaultCooldown = 5 * time.Second
	// MaxCooldown caps every rate cooldown, whatever the upstream asks for.
	MaxCooldown = 5 * time.Minute
	// DefaultBillingCooldown is how long a credential cools after an answer saying its
	// account is out of credit (routing.billing_cooldown_seconds absent).
	DefaultBillingCooldown = 15 * time.Minute
	// MaxBillingCooldown caps a billing cooldown, configured or asked for.
	MaxBillingCooldown = 6 * time.Hour
	// MinBillingCooldown is the least routing.billing_cooldown_seconds: longer than
	// any rate cooldown.
	MinBillingCooldown = MaxCooldown
)

// Registered reports whether the model declares its upstreams in the registry.
func (m *Model) Registered() bool { return len(m.Upstreams) > 0 }

// RegistryUpstreams is the set of upstream names that some model's registry entry
// names: such an upstream serves those models (and the ones it lists), and is never
// the catch-all even with an empty models list.
func (c *Config) RegistryUpstreams() map[string]bool {
	out := map[string]bool{}
	for _, m := range c.Models {
		for _, mu := range m.Upstreams {
			out[mu.Upstream] = true
		}
	}
	return out
}

func (c *Config) validateRegistry(errs *fieldErrors) {
	c.validateFallbacks(errs)
	upstreams := map[string]int{}
	for i, u := range c.Upstreams {
		upstreams[u.Name] = i
		if u.Provider != "" {
			oneOf(errs, fmt.Sprintf("upstreams[%d].provider", i), u.Provider, []Provider{ProviderOpenAI, ProviderAnthropic})
		}
	}
	listedBy := map[string]int{}
	for i, u := range c.Upstreams {
		for _, m := range u.Models {
			if _, dup := listedBy[m]; !dup {
				listedBy[m] = i
			}
		}
	}
	for i, m := range c.Models {
		f := fmt.Sprintf("models[%d]", i)
		if m.Tokenizer != "" {
			oneOf(errs, f+".tokenizer", m.Tokenizer, Tokenizers)
		}
		nonNegative(errs, f+".context_window", m.ContextWindow)
		nonNegative(errs, f+".max_output_tokens", m.MaxOutputTokens)
		if m.ContextWindow > 0 && m.MaxOutputTokens > m.ContextWindow {
			errs.add(f+".max_output_tokens", "%d is larger than the context_window %d that input and output share", m.MaxOutputTokens, m.ContextWindow)
		}
		if len(m.Upstreams) == 0 {
			continue
		}
		if j, listed := listedBy[m.Name]; listed {
			errs.add(f+".upstreams", "model %q is also listed by upstreams[%d].models: a registered model's upstreams are listed here only; remove it there", m.Name, j)
		}
		seen := map[string]int{}
		for k, mu := range m.Upstreams {
			uf := fmt.Sprintf("%s.upstreams[%d]", f, k)
			_, ok := upstreams[mu.Upstream]
			switch {
			case mu.Upstream == "":
				errs.add(uf+".upstream", "must name an entry of upstreams")
			case !ok:
				errs.add(uf+".upstream", "no entry of upstreams is named %q", mu.Upstream)
			}
			if prev, dup := seen[mu.Upstream]; dup && mu.Upstream != "" {
				errs.add(uf+".upstream", "%q is also %s.upstreams[%d]: an upstream is tried once", mu.Upstream, f, prev)
			}
			seen[mu.Upstream] = k
			if len(mu.ProviderModel) > 256 {
				errs.add(uf+".provider_model", "must be at most 256 characters")
			}
			if mu.Tokenizer != "" {
				oneOf(errs, uf+".tokenizer", mu.Tokenizer, Tokenizers)
			}
		}
		c.validateEncodings(errs, f, &m, upstreams)
	}
}

// validateEncodings refuses a model in tokenizer mode with a candidate that has no
// encoding: one naming none (nor the model), or an Anthropic upstream, whose tokens
// no encoding here counts. Counting it with another's encoding would under-reserve.
func (c *Config) validateEncodings(errs *fieldErrors, f string, m *Model, upstreams map[string]int) {
	if !m.Tokenized() {
		return
	}
	for k, mu := range m.Upstreams {
		uf := fmt.Sprintf("%s.upstreams[%d]", f, k)
		i, ok := upstreams[mu.Upstream]
		switch {
		case !ok:
		case c.Upstreams[i].Provider == ProviderAnthropic:
			errs.add(uf, "upstream %q speaks the Anthropic API: no encoding here counts its tokens, and model %q is in tokenizer mode; remove its tokenizer or this upstream", mu.Upstream, m.Name)
		case m.Encoding(k) == "":
			errs.add(uf+".tokenizer", "model %q is in tokenizer mode and upstream %q has no encoding: name one here or in %s.tokenizer", m.Name, mu.Upstream, f)
		}
	}
}

// validateFallbacks checks the rules' fallback models: only a model-scoped rule
// (dimension model, no fan-out by another attribute) may send a request elsewhere, so
// a tenant out of its own budget stays refused; and the fallback is a model of the
// registry.
func (c *Config) validateFallbacks(errs *fieldErrors) {
	for i, r := range c.RateLimiting.Rules {
		if r.FallbackModel == "" {
			continue
		}
		f := fmt.Sprintf("rate_limiting.rules[%d].fallback_model", i)
		switch {
		case r.Dimension != RuleModel || r.CountBy != "":
			errs.add(f, "only a rule of dimension model without count_by may fall back: a budget of a tenant refuses whatever the model")
		case !slices.ContainsFunc(c.Models, func(m Model) bool { return m.Name == r.FallbackModel }):
			errs.add(f, "%q is not a model of models: add it there with its upstreams", r.FallbackModel)
		case slices.Contains(r.Subjects, r.FallbackModel) && len(r.Subjects) == 1:
			errs.add(f, "%q is the model the rule governs", r.FallbackModel)
		}
	}
}

// ModelUpstreamsFor is the provenance-free answer to "which upstreams serve model,
// in order": the registry's list when the model has one; else the upstream that lists
// it; else the catch-all (the first upstream with an empty models list that no
// registry entry names). Empty when none serves it.
func (c *Config) ModelUpstreamsFor(model string) []ModelUpstream {
	if i := slices.IndexFunc(c.Models, func(m Model) bool { return m.Name == model }); i >= 0 && c.Models[i].Registered() {
		return c.Models[i].Upstreams
	}
	for _, u := range c.Upstreams {
		if slices.Contains(u.Models, model) {
			return []ModelUpstream{{Upstream: u.Name}}
		}
	}
	reg := c.RegistryUpstreams()
	for _, u := range c.Upstreams {
		if len(u.Models) == 0 && !reg[u.Name] {
			return []ModelUpstream{{Upstream: u.Name}}
		}
	}
	return nil
}
