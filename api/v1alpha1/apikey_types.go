// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ApiKeySpec is a client credential of one fleet. The key itself stays in a Secret:
// the operator renders only its SHA-256 into the proxy config.
type ApiKeySpec struct { //nolint:revive // the Kind is ApiKey
	// ProxyRef is the TokenProxy (fleet) that accepts this key.
	// +required
	ProxyRef ProxyReference `json:"proxyRef"`

	// SecretRef selects the Secret key that holds the API key clients send. The
	// Secret is in the ApiKey's namespace and labelled tokenwarden.io/secret: api-key.
	// +required
	SecretRef SecretKeyReference `json:"secretRef"`

	// User is the user the key belongs to: its PerUser budget. Empty: none.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	User string `json:"user,omitempty"`

	// Team is the team the key belongs to: its PerTeam budget. Empty: none.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	Team string `json:"team,omitempty"`

	// RequestsPerSecond overrides the PerAPIKey request rate for this key. 0: none.
	// A tenant's key (another namespace than its fleet's, tenancy Namespaces) may only
	// lower the fleet's; this holds for each of the key's own limits.
	// +optional
	// +kubebuilder:validation:Minimum=0
	RequestsPerSecond int64 `json:"requestsPerSecond,omitempty"`

	// BurstCapacity overrides the burst of this key's request rate. 0: none.
	// +optional
	// +kubebuilder:validation:Minimum=0
	BurstCapacity int64 `json:"burstCapacity,omitempty"`

	// TokensPerMinute overrides the PerAPIKey minute budget for this key, as a fleet
	// total (divided among the replicas like every budget). 0: none.
	// +optional
	// +kubebuilder:validation:Minimum=0
	TokensPerMinute int64 `json:"tokensPerMinute,omitempty"`

	// TokensPerDay overrides the PerAPIKey day budget for this key, as a fleet total
	// (divided among the replicas like every budget). 0: none.
	// +optional
	// +kubebuilder:validation:Minimum=0
	TokensPerDay int64 `json:"tokensPerDay,omitempty"`

	// Bypass exempts the key from every limit. Default false. The key is accepted
	// only where its fleet's spec.allowBypass allows bypass keys.
	// +optional
	Bypass bool `json:"bypass,omitempty"`

	// Priority is the key's class in an upstream's queue: Interactive, Batch or
	// Background. A request may lower it with x-tokenwarden-priority, never raise it.
	// Default Interactive.
	// +optional
	Priority Priority `json:"priority,omitempty"`

	// Weight is the key's share of token service against the other keys of its class
	// when they wait. Default 1.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1000
	Weight int32 `json:"weight,omitempty"`

	// MaxInFlight bounds the key's requests forwarded and not yet answered in full:
	// in the whole fleet under Redis storage, on each replica under memory storage;
	// one more gets 429 in_flight_limit. 0: none.
	// +optional
	// +kubebuilder:validation:Minimum=0
	MaxInFlight int64 `json:"maxInFlight,omitempty"`

	// RunTokenBudget bounds the tokens one run of the key (its x-tokenwarden-run-id
	// header) reserves and spends, in the whole fleet under Redis storage, on each
	// replica under memory storage; beyond it 429 run_budget_exceeded. 0: none.
	// +optional
	// +kubebuilder:validation:Minimum=0
	RunTokenBudget int64 `json:"runTokenBudget,omitempty"`

	// RunMaxSteps bounds the requests one run of the key sends, in the whole fleet
	// under Redis storage, on each replica under memory storage; one more gets 429
	// run_steps_exceeded. 0: none.
	// +optional
	// +kubebuilder:validation:Minimum=0
	RunMaxSteps int64 `json:"runMaxSteps,omitempty"`
}

// ApiKeyStatus is what the operator observed.
type ApiKeyStatus struct { //nolint:revive // the Kind is ApiKey
	// ObservedGeneration is the generation this status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Fingerprint is the first 8 hex digits of the key's SHA-256, to tell keys apart
	// without revealing them.
	// +optional
	// +kubebuilder:validation:MaxLength=8
	Fingerprint string `json:"fingerprint,omitempty"`
	// ConfigGeneration is the generation of the fleet's config that first held this
	// key's current content (its spec and its Secret's hash); 0 while it is not in the
	// config. The key is Enforced once every live replica has loaded this generation
	// or a later one.
	// +optional
	ConfigGeneration int64 `json:"configGeneration,omitempty"`
	// Conditions: Accepted (its fleet accepts it and its Secret exists), Ready (in the rendered
	// config) and Enforced (loaded by every live replica).
	// +optional
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=8
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// ApiKey is a client credential: its Secret, its user and team, and its overrides.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=ak,categories=tokenwarden
// +kubebuilder:printcolumn:name="User",type=string,JSONPath=`.spec.user`
// +kubebuilder:printcolumn:name="Team",type=string,JSONPath=`.spec.team`
// +kubebuilder:printcolumn:name="Fingerprint",type=string,JSONPath=`.status.fingerprint`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type ApiKey struct { //nolint:revive // the Kind is ApiKey
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +required
	Spec ApiKeySpec `json:"spec"`
	// +optional
	Status ApiKeyStatus `json:"status,omitempty"`
}

// ApiKeyList is a list of ApiKeys.
// +kubebuilder:object:root=true
type ApiKeyList struct { //nolint:revive // the Kind is ApiKey
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ApiKey `json:"items"`
}
