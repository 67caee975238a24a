// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// SecretUsageLabel on a Secret says what the operator may use it for; the operator
// reads (and caches) no other Secret. Its values are SecretUsageAPIKey and
// SecretUsageCredential: one key, so that one label selector selects both, and two
// values, so that an ApiKey can never make a fleet's upstream credential a working
// API key.
const SecretUsageLabel = "tokenwarden.io/secret"

// Values of SecretUsageLabel.
const (
	// SecretUsageAPIKey marks a Secret that an ApiKey of its namespace may use.
	SecretUsageAPIKey = "api-key"
	// SecretUsageCredential marks a Secret that a TokenProxy of its namespace may
	// hand to its pods: an upstream credential or the Redis password.
	SecretUsageCredential = "credential"
)

// FromNamespaces says which namespaces a fleet accepts TokenBudgets and ApiKeys from.
// +kubebuilder:validation:Enum=Same;All;Selector
type FromNamespaces string

// The namespaces a fleet accepts objects from.
const (
	// NamespacesFromSame: the fleet's own namespace only.
	NamespacesFromSame FromNamespaces = "Same"
	// NamespacesFromAll: every namespace.
	NamespacesFromAll FromNamespaces = "All"
	// NamespacesFromSelector: the fleet's own namespace and the namespaces whose
	// labels match the selector.
	NamespacesFromSelector FromNamespaces = "Selector"
)

// AllowedNamespaces names the namespaces whose TokenBudgets and ApiKeys a fleet
// accepts, in the style of Gateway API's allowedRoutes.namespaces. The fleet's own
// namespace is always allowed.
// +kubebuilder:validation:XValidation:rule="self.from == 'Selector' ? has(self.selector) : !has(self.selector)",message="selector is required when from is Selector and must not be set otherwise"
type AllowedNamespaces struct {
	// From is Same (the fleet's namespace only), All, or Selector (the namespaces
	// whose labels match selector). Default Same.
	// +optional
	// +kubebuilder:default=Same
	From FromNamespaces `json:"from,omitempty"`
	// Selector selects namespaces by their labels when from is Selector.
	// +optional
	Selector *metav1.LabelSelector `json:"selector,omitempty"`
}

// BypassPolicy says which ApiKeys of a fleet may set bypass.
// +kubebuilder:validation:Enum=None;Same;All
type BypassPolicy string

// Bypass policies.
const (
	// BypassNone: no key of the fleet may bypass its limits.
	BypassNone BypassPolicy = "None"
	// BypassSame: keys in the fleet's own namespace may.
	BypassSame BypassPolicy = "Same"
	// BypassAll: keys in every namespace the fleet accepts keys from may.
	BypassAll BypassPolicy = "All"
)

// Condition reasons of scoped reads.
const (
	// ReasonNotAllowed: the object's namespace is not one the fleet accepts objects
	// from (spec.allowedNamespaces).
	ReasonNotAllowed = "NotAllowed"
	// ReasonBypassNotAllowed: the key sets bypass, and its fleet does not allow it
	// (spec.allowBypass).
	ReasonBypassNotAllowed = "BypassNotAllowed"
	// ReasonWeightNotAllowed: a tenant's key sets a scheduling weight above what its
	// fleet allows tenants (spec.maxTenantKeyWeight).
	ReasonWeightNotAllowed = "WeightNotAllowed"
)

// Tenancy says what the TokenBudgets and ApiKeys of the namespaces a fleet accepts may
// reach.
// +kubebuilder:validation:Enum=Flat;Namespaces
type Tenancy string

// Tenancies.
const (
	// TenancyFlat: every accepted TokenBudget applies to the whole fleet and teams and
	// users are shared by name, whatever namespace holds them (the meaning before
	// tenancy existed).
	TenancyFlat Tenancy = "Flat"
	// TenancyNamespaces: each accepted namespace other than the fleet's is a tenant.
	// Its TokenBudgets apply only to its own keys and stack with the platform's (the
	// fleet namespace's), its keys' teams and users are qualified by its namespace
	// (team-a/research), and its conflicts are resolved within it.
	TenancyNamespaces Tenancy = "Namespaces"
)

// ConditionTenantIsolation is, on a TokenProxy, True (reason Namespaces) when each
// accepted namespace is a tenant that cannot reach the others, and False (reason Flat)
// when every accepted TokenBudget applies to the whole fleet.
const ConditionTenantIsolation = "TenantIsolation"

// Reasons of TenantIsolation.
const (
	ReasonTenancyNamespaces = "Namespaces"
	ReasonTenancyFlat       = "Flat"
)
