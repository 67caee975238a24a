// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Dimension is what a budget is counted per.
// +kubebuilder:validation:Enum=Global;PerClient;PerAPIKey;PerUser;PerTeam;PerModel
type Dimension string

// The six dimensions.
const (
	DimensionGlobal    Dimension = "Global"
	DimensionPerClient Dimension = "PerClient"
	DimensionPerAPIKey Dimension = "PerAPIKey"
	DimensionPerUser   Dimension = "PerUser"
	DimensionPerTeam   Dimension = "PerTeam"
	DimensionPerModel  Dimension = "PerModel"
)

// TokenBudgetSpec is one dimension's budget for one fleet. Every number is a fleet
// total; the operator divides it among the replicas when storage is memory.
// +kubebuilder:validation:XValidation:rule="self.dimension == 'PerModel' ? (has(self.model) && size(self.model) > 0) : !has(self.model)",message="model is required when dimension is PerModel and must not be set otherwise"
// +kubebuilder:validation:XValidation:rule="self.tokensPerMinute > 0 || self.tokensPerDay > 0 || self.requestsPerSecond > 0",message="at least one of tokensPerMinute, tokensPerDay and requestsPerSecond must be positive"
// +kubebuilder:validation:XValidation:rule="self.burstCapacity == 0 || self.requestsPerSecond > 0",message="burstCapacity needs requestsPerSecond"
type TokenBudgetSpec struct {
	// ProxyRef is the TokenProxy (fleet) this budget applies to.
	// +required
	ProxyRef ProxyReference `json:"proxyRef"`

	// Dimension is what the budget is counted per: Global (the whole fleet),
	// PerClient (client address), PerAPIKey, PerUser, PerTeam or PerModel.
	// +required
	Dimension Dimension `json:"dimension"`

	// Model is the client-facing model name of a PerModel budget; set exactly when
	// the dimension is PerModel.
	// +optional
	// +kubebuilder:validation:MaxLength=256
	Model string `json:"model,omitempty"`

	// TokensPerMinute is the minute budget in tokens: a bucket of one minute of the
	// rate, refilled continuously. 0 is unlimited. Default 0.
	// +optional
	// +kubebuilder:default=0
	// +kubebuilder:validation:Minimum=0
	TokensPerMinute int64 `json:"tokensPerMinute"`

	// TokensPerDay is the day budget in tokens: a bucket of one day of the rate,
	// refilled continuously (it does not reset at midnight). 0 is unlimited. Default 0.
	// +optional
	// +kubebuilder:default=0
	// +kubebuilder:validation:Minimum=0
	TokensPerDay int64 `json:"tokensPerDay"`

	// RequestsPerSecond is the request rate per replica. 0 is unlimited. Default 0.
	// +optional
	// +kubebuilder:default=0
	// +kubebuilder:validation:Minimum=0
	RequestsPerSecond int64 `json:"requestsPerSecond"`

	// BurstCapacity is the request bucket's size (default: one second of the rate).
	// +optional
	// +kubebuilder:default=0
	// +kubebuilder:validation:Minimum=0
	BurstCapacity int64 `json:"burstCapacity"`
}

// PerReplicaAllowance is what each replica enforces.
type PerReplicaAllowance struct {
	// TokensPerMinute each replica enforces; absent when unlimited.
	// +optional
	TokensPerMinute *int64 `json:"tokensPerMinute,omitempty"`
	// TokensPerDay each replica enforces; absent when unlimited.
	// +optional
	TokensPerDay *int64 `json:"tokensPerDay,omitempty"`
}

// TokenBudgetStatus is what the operator observed and enforces.
type TokenBudgetStatus struct {
	// ObservedGeneration is the generation this status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Replicas is the divisor in force: the fleet's replica count under memory
	// storage, 1 under Redis (the shared buckets hold the total).
	// +optional
	Replicas int64 `json:"replicas,omitempty"`
	// PerReplica is the allowance each replica enforces (the shared total under Redis).
	// +optional
	PerReplica PerReplicaAllowance `json:"perReplica,omitempty"`
	// Storage is the fleet's storage: Memory or Redis.
	// +optional
	Storage StorageType `json:"storage,omitempty"`
	// ConfigGeneration is the generation of the fleet's config that first held this
	// budget's current content; 0 while it is not in the config. The budget is
	// Enforced once every live replica has loaded this generation or a later one.
	// +optional
	ConfigGeneration int64 `json:"configGeneration,omitempty"`
	// Conditions: Accepted (valid, its fleet exists, no conflict), Ready (in the
	// rendered config) and Enforced (loaded by every live replica).
	// +optional
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=8
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// Live usage (tokenbudget_usage_types.go).

	// Usage is the fleet's live use of the budget, summed from the proxy replicas'
	// usage reports; absent until the budget is first used.
	// +optional
	Usage *TokenBudgetUsage `json:"usage,omitempty"`
}

// TokenBudget is a token budget per minute and per day on one dimension of a fleet.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=tb,categories=tokenwarden
// +kubebuilder:printcolumn:name="Dimension",type=string,JSONPath=`.spec.dimension`
// +kubebuilder:printcolumn:name="Model",type=string,JSONPath=`.spec.model`
// +kubebuilder:printcolumn:name="TPM",type=integer,JSONPath=`.spec.tokensPerMinute`
// +kubebuilder:printcolumn:name="TPD",type=integer,JSONPath=`.spec.tokensPerDay`
// +kubebuilder:printcolumn:name="Replicas",type=integer,JSONPath=`.status.replicas`
// +kubebuilder:printcolumn:name="Per-Replica TPM",type=integer,JSONPath=`.status.perReplica.tokensPerMinute`
// +kubebuilder:printcolumn:name="Per-Replica TPD",type=integer,JSONPath=`.status.perReplica.tokensPerDay`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Used",type=string,JSONPath=`.status.usage.used`
// +kubebuilder:printcolumn:name="At Limit",type=integer,JSONPath=`.status.usage.subjectsAtLimit`
// +kubebuilder:printcolumn:name="Top Consumer",type=string,JSONPath=`.status.usage.topConsumer`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type TokenBudget struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +required
	Spec TokenBudgetSpec `json:"spec"`
	// +optional
	Status TokenBudgetStatus `json:"status,omitempty"`
}

// TokenBudgetList is a list of TokenBudgets.
// +kubebuilder:object:root=true
type TokenBudgetList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []TokenBudget `json:"items"`
}
