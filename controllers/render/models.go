// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package render

import (
	twv1alpha1 "github.com/tokenwarden/tokenwarden/api/v1alpha1"
	"github.com/tokenwarden/tokenwarden/proxy/config"
)

// renderProvider is an upstream's API family in the proxy's words.
func renderProvider(p twv1alpha1.Provider) config.Provider {
	switch p {
	case twv1alpha1.ProviderOpenAI:
		return config.ProviderOpenAI
	case twv1alpha1.ProviderAnthropic:
		return config.ProviderAnthropic
	}
	return ""
}

// renderAdmission is an admission policy in the proxy's words.
func renderAdmission(p twv1alpha1.AdmissionPolicy) config.AdmissionPolicy {
	switch p {
	case twv1alpha1.AdmissionRefuse:
		return config.AdmitRefuse
	case twv1alpha1.AdmissionClamp:
		return config.AdmitClamp
	}
	return ""
}

// renderRouting copies the fleet's routing defaults.
func renderRouting(r *twv1alpha1.RoutingSpec, c *config.Config) {
	c.Routing.AdmissionPolicy = renderAdmission(r.AdmissionPolicy)
	c.Routing.BillingCooldownSeconds = r.BillingCooldownSeconds
}

// renderRegistry copies a model's registry entry (context window, largest output,
// ordered upstreams, tokenizer) into the proxy's model; the proxy's validation, which
// the operator runs before it writes, checks that each upstream exists.
func renderRegistry(cm *config.Model, m *twv1alpha1.ModelSpec) {
	cm.ContextWindow, cm.MaxOutputTokens = m.ContextWindow, m.MaxOutputTokens
	cm.Tokenizer = m.Tokenizer
	cm.AdmissionPolicy = renderAdmission(m.AdmissionPolicy)
	cm.AcceptsLoweredOutputCap = m.AcceptsLoweredOutputCap
	cm.UnavailableFallback = m.UnavailableFallback
	for _, u := range m.Upstreams {
		cm.Upstreams = append(cm.Upstreams, config.ModelUpstream{Upstream: u.Upstream, ProviderModel: u.ProviderModel, Tokenizer: u.Tokenizer})
	}
}
