// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package admin

import (
	"fmt"
	"slices"
	"time"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/proxy/config"
	"github.com/tokenwarden/tokenwarden/proxy/health"
	"github.com/tokenwarden/tokenwarden/proxy/upstream"
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

	// Models is the model registry with where each value came from (Models).
	Models []EffectiveModel `json:"models"`
	// Routing is the fleet's routing defaults in force (Routing).
	Routing EffectiveRouting `json:"routing"`
}

// EffectiveRouting is the fleet's routing defaults in /admin/effective.
type EffectiveRouting struct {
	// AdmissionPolicy is the policy of a model that names none.
	AdmissionPolicy EffectiveValue `json:"admission_policy"`
	// BillingCooldownSeconds is how long a credential cools after a billing answer
	// before a replica probes it.
	BillingCooldownSeconds EffectiveValue `json:"billing_cooldown_seconds"`
}

// Routing is a config's routing defaults as they are in force.
func Routing(c *config.Config) EffectiveRouting {
	e := EffectiveRouting{
		AdmissionPolicy:        EffectiveValue{Value: string(config.AdmitRefuse), From: "default"},
		BillingCooldownSeconds: EffectiveValue{Value: int64(config.DefaultBillingCooldown / time.Second), From: "default"},
	}
	if p := c.Routing.AdmissionPolicy; p != "" {
		e.AdmissionPolicy = EffectiveValue{Value: string(p), From: "routing.admission_policy"}
	}
	if s := c.Routing.BillingCooldownSeconds; s > 0 {
		e.BillingCooldownSeconds = EffectiveValue{Value: s, From: "routing.billing_cooldown_seconds"}
	}
	return e
}

// admission is the admission policy in force for models[i]: what becomes of an
// over-ask, and the fields that decide it.
func admission(c *config.Config, i int) EffectiveValue {
	m := &c.Models[i]
	f := fmt.Sprintf("models[%d]", i)
	from := "default"
	switch {
	case m.AdmissionPolicy != "":
		from = f + ".admission_policy"
	case c.Routing.AdmissionPolicy != "":
		from = "routing.admission_policy"
	}
	p := c.Admission(m)
	if p == config.AdmitClamp && !m.AcceptsLoweredOutputCap {
		return EffectiveValue{Value: string(config.AdmitRefuse),
			From: from + " is clamp, but " + f + ".accepts_lowered_output_cap is not set: an over-ask is refused"}
	}
	return EffectiveValue{Value: string(p), From: from}
}

// EffectiveUpstrm is one upstream in /admin/effective.
type EffectiveUpstrm struct {
	Name   string   `json:"name"`
	URL    string   `json:"url"`
	Models []string `json:"models"`
}

// EffectiveKey is one API key in /admin/effective, by name.
type EffectiveKey struct {
	Name string `json:"name"`
	User string `json:"user,omitempty"`
	Team string `json:"team,omitempty"`
	// Tenant is the key's tenant (its namespace); empty for the platform's own keys.
	Tenant string `json:"tenant,omitempty"`
	Bypass bool   `json:"bypass,omitempty"`
}

// EffectiveModel is one model of the registry in /admin/effective: each value with
// where it came from (a field of the document, or a default).
type EffectiveModel struct {
	Name            string         `json:"name"`
	ContextWindow   EffectiveValue `json:"context_window"`
	MaxOutputTokens EffectiveValue `json:"max_output_tokens"`
	Price           EffectiveValue `json:"price"`
	// AdmissionPolicy is what becomes of an over-ask: refuse or clamp, as it acts
	// (clamp acts only on a model that accepts a lowered cap).
	AdmissionPolicy EffectiveValue `json:"admission_policy"`
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
	// Tokenizer is the encoding that counts the input for this upstream, in tokenizer
	// mode: its own or the model's.
	Tokenizer string `json:"tokenizer,omitempty"`
	From      string `json:"from"`
	// Breaker is closed, open or half_open; CoolingUntil is set while the
	// credential cools within its interval, and Cooldown while it is out (a billing
	// cooldown holds past its interval until a probe ends it). All are this
	// replica's, which learns the fleet's billing cooldowns from its Redis.
	Breaker      string     `json:"breaker"`
	CoolingUntil *time.Time `json:"cooling_until,omitempty"`
	Cooldown     *Cooldown  `json:"cooldown,omitempty"`
}

// Models is a config's model registry as it is in force at now: every model of
// models, then every model only an upstream's models list names, with the health of
// each upstream (h) and the catch-all that serves what no upstream lists.
func Models(c *config.Config, catchAll *upstream.Upstream, h *health.Registry, now time.Time) []EffectiveModel {
	out := []EffectiveModel{}
	idx := map[string]int{}
	for i, u := range c.Upstreams {
		idx[u.Name] = i
	}
	server := func(up config.Upstream, model, providerModel, from string) EffectiveServer {
		e := EffectiveServer{Upstream: up.Name, URL: up.URL, Provider: string(up.Provider), ProviderModel: model, From: from,
			Breaker: h.Breaker(up.Name).State(now).String()}
		if providerModel != "" {
			e.ProviderModel = providerModel
		}
		if c, ok := h.Cooldown(upstream.CredentialKey(up)).State(now); ok {
			e.Cooldown = cooldownOf(c)
			if now.Before(c.Until) {
				e.CoolingUntil = &c.Until
			}
		}
		return e
	}
	routed := func(name string) []EffectiveServer {
		for i, u := range c.Upstreams {
			if slices.Contains(u.Models, name) {
				return []EffectiveServer{server(u, name, "", fmt.Sprintf("upstreams[%d].models", i))}
			}
		}
		if up := catchAll; up != nil {
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
			AdmissionPolicy: admission(c, i),
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
				e.Upstreams[k].Tokenizer = m.Encoding(k)
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
				AdmissionPolicy: EffectiveValue{From: "unset: not in models, not pre-checked"},
				Upstreams:       routed(name)})
		}
	}
	return out
}
