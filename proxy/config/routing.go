// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package config

import (
	"fmt"
	"slices"
	"time"
)

// AdmissionPolicy is what becomes of a request whose stated output does not fit its
// model: more than the model generates, or more than its context window leaves after
// the input.
type AdmissionPolicy string

// Admission policies.
const (
	// AdmitRefuse refuses the over-ask with 400 before any budget or upstream sees it.
	AdmitRefuse AdmissionPolicy = "refuse"
	// AdmitClamp forwards the over-ask with its output cap lowered to what the model
	// and its window leave, when the model declares accepts_lowered_output_cap;
	// without that declaration it refuses, as refuse does.
	AdmitClamp AdmissionPolicy = "clamp"
)

// AdmissionPolicies are the policies a document may name.
var AdmissionPolicies = []AdmissionPolicy{AdmitRefuse, AdmitClamp}

// Routing holds the fleet's defaults for where and how a request goes.
type Routing struct {
	// AdmissionPolicy is the admission policy of a model that names none: refuse
	// (absent) or clamp.
	AdmissionPolicy AdmissionPolicy `json:"admission_policy,omitempty"`
	// BillingCooldownSeconds is how long a credential cools after an answer saying its
	// provider account is out of credit, before a replica probes it (0 or absent:
	// DefaultBillingCooldown; at least MinBillingCooldown, at most MaxBillingCooldown).
	BillingCooldownSeconds int64 `json:"billing_cooldown_seconds,omitempty"`
}

// BillingCooldown is the billing cooldown's configured interval.
func (c *Config) BillingCooldown() time.Duration {
	if s := c.Routing.BillingCooldownSeconds; s > 0 {
		return time.Duration(s) * time.Second
	}
	return DefaultBillingCooldown
}

// Admission is the admission policy in force for m: its own, else the fleet's,
// else refuse.
func (c *Config) Admission(m *Model) AdmissionPolicy {
	switch {
	case m.AdmissionPolicy != "":
		return m.AdmissionPolicy
	case c.Routing.AdmissionPolicy != "":
		return c.Routing.AdmissionPolicy
	}
	return AdmitRefuse
}

// validateRouting checks the routing defaults and each model's admission policy.
func (c *Config) validateRouting(errs *fieldErrors) {
	if p := c.Routing.AdmissionPolicy; p != "" {
		oneOf(errs, "routing.admission_policy", p, AdmissionPolicies)
	}
	if s := c.Routing.BillingCooldownSeconds; s != 0 && (s < int64(MinBillingCooldown/time.Second) || s > int64(MaxBillingCooldown/time.Second)) {
		errs.add("routing.billing_cooldown_seconds", "%d is outside %d to %d: a billing cooldown is longer than any rate cooldown, and capped",
			s, int64(MinBillingCooldown/time.Second), int64(MaxBillingCooldown/time.Second))
	}
	for i, m := range c.Models {
		if m.AdmissionPolicy != "" {
			oneOf(errs, fmt.Sprintf("models[%d].admission_policy", i), m.AdmissionPolicy, AdmissionPolicies)
		}
		c.validateUnavailableFallback(errs, i)
	}
}

// validateUnavailableFallback checks models[i].unavailable_fallback: a model of its
// own, another one, with upstreams of the registry (it must be able to be
// unavailable, and its health to be known).
func (c *Config) validateUnavailableFallback(errs *fieldErrors, i int) {
	m := &c.Models[i]
	to := m.UnavailableFallback
	if to == "" {
		return
	}
	f := fmt.Sprintf("models[%d].unavailable_fallback", i)
	j := slices.IndexFunc(c.Models, func(o Model) bool { return o.Name == to })
	switch {
	case !m.Registered():
		errs.add(f, "model %q has no upstreams of its own here: only a model the registry routes can be unavailable", m.Name)
	case to == m.Name:
		errs.add(f, "%q is the model itself", to)
	case j < 0 || !c.Models[j].Registered():
		errs.add(f, "%q is not a model of models with upstreams: add it there with its upstreams", to)
	}
}
