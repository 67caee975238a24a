// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package v1alpha1

import (
	"k8s.io/apimachinery/pkg/api/resource"
)

// Priority is an ApiKey's class in an upstream's queue.
// +kubebuilder:validation:Enum=Interactive;Batch;Background
type Priority string

// Priority classes, served in this order.
const (
	PriorityInteractive Priority = "Interactive"
	PriorityBatch       Priority = "Batch"
	PriorityBackground  Priority = "Background"
)

// OverMaxOutputTokens is what the proxy does with a request that asks for more output
// than its class's cap.
// +kubebuilder:validation:Enum=Clamp;Refuse
type OverMaxOutputTokens string

// Actions on a request beyond its class's maxOutputTokens.
const (
	// OverMaxOutputTokensClamp lowers the request's limit to the cap.
	OverMaxOutputTokensClamp OverMaxOutputTokens = "Clamp"
	// OverMaxOutputTokensRefuse answers 400.
	OverMaxOutputTokensRefuse OverMaxOutputTokens = "Refuse"
)

// UpstreamCapacity is what an upstream runs at once; at it, admitted requests wait in
// the proxy's queue, served by priority class and token-fair queueing.
// +kubebuilder:validation:XValidation:rule="has(self.maxInFlightRequests) || has(self.maxInFlightTokens)",message="capacity needs maxInFlightRequests or maxInFlightTokens"
type UpstreamCapacity struct {
	// MaxInFlightRequests bounds the requests forwarded and not yet answered in full,
	// per proxy replica. 0: no bound.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100000
	MaxInFlightRequests int64 `json:"maxInFlightRequests,omitempty"`
	// MaxInFlightTokens bounds the tokens those requests reserved (input estimate plus
	// output limit), per proxy replica. 0: no bound.
	// +optional
	// +kubebuilder:validation:Minimum=0
	MaxInFlightTokens int64 `json:"maxInFlightTokens,omitempty"`
}

// SchedulingSpec orders the requests waiting for an upstream's capacity, bounds their
// waits, and sets the limits for agents.
// +kubebuilder:validation:XValidation:rule="!has(self.interactive) || !has(self.interactive.minSharePercent)",message="interactive is served first and has no minimum share; minSharePercent is for batch and background",fieldPath=".interactive.minSharePercent"
type SchedulingSpec struct {
	// MaxQueueWaitSeconds bounds a wait for a class without its own; a request still
	// queued then gets 429 queue_timeout. Default 30.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=600
	MaxQueueWaitSeconds int64 `json:"maxQueueWaitSeconds,omitempty"`
	// MaxQueueLength bounds each upstream's waiting requests per replica; one more
	// gets 429 queue_full. Default 1000.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1000000
	MaxQueueLength int64 `json:"maxQueueLength,omitempty"`
	// MaxQueueBytes bounds the request bodies each upstream's waiting requests hold in
	// a replica's memory; past it 429 queue_full. Default 256 MiB.
	// +optional
	// +kubebuilder:validation:Minimum=1
	MaxQueueBytes int64 `json:"maxQueueBytes,omitempty"`
	// AgingSeconds raises a waiting class by one for every agingSeconds its oldest
	// request has waited. Default: no aging (the classes' minSharePercent keep batch
	// and background from starving); under a lasting backlog an aging shorter than the
	// lower class's wait lets the backlog go ahead of the classes above it.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=3600
	AgingSeconds int64 `json:"agingSeconds,omitempty"`
	// OutputWeight is what an output token counts in token-fair queueing against 1
	// for an input token, for example "2" or "1.5". Default 2.
	// +optional
	// +kubebuilder:validation:XValidation:rule="quantity(string(self)).isGreaterThan(quantity('0'))",message="outputWeight must be greater than 0"
	OutputWeight *resource.Quantity `json:"outputWeight,omitempty"`
	// Interactive, Batch and Background are each class's own bounds.
	// +optional
	Interactive *ClassSpec `json:"interactive,omitempty"`
	// +optional
	Batch *ClassSpec `json:"batch,omitempty"`
	// +optional
	Background *ClassSpec `json:"background,omitempty"`
	// MaxRuns bounds the agent runs each replica keeps for the keys' run budgets; the
	// run seen least recently is forgotten first. Default 10000.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=10000000
	MaxRuns int64 `json:"maxRuns,omitempty"`
	// RunIdleSeconds forgets a run that sent nothing for this long. Default 900.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=604800
	RunIdleSeconds int64 `json:"runIdleSeconds,omitempty"`
}

// ClassSpec bounds the requests of one priority class.
// +kubebuilder:validation:XValidation:rule="!has(self.overMaxOutputTokens) || has(self.maxOutputTokens)",message="overMaxOutputTokens needs maxOutputTokens"
type ClassSpec struct {
	// MaxQueueWaitSeconds bounds a wait of this class. Default: the scheduling's
	// maxQueueWaitSeconds.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=600
	MaxQueueWaitSeconds int64 `json:"maxQueueWaitSeconds,omitempty"`
	// MinSharePercent is the share, in percent, of the tokens an upstream forwards
	// from its queue that batch or background keeps while it waits, however much
	// higher work waits. Default 10 for batch, 5 for background; not for interactive,
	// which is served first.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=50
	MinSharePercent int64 `json:"minSharePercent,omitempty"`
	// MaxOutputTokens caps the output a request of this class may ask for
	// (max_tokens, max_completion_tokens, max_output_tokens); a request that states
	// none gets the cap. Default: no cap.
	// +optional
	// +kubebuilder:validation:Minimum=1
	MaxOutputTokens int64 `json:"maxOutputTokens,omitempty"`
	// OverMaxOutputTokens is Clamp (lower the request's limit to the cap, before it is
	// estimated) or Refuse (answer 400). Default Clamp.
	// +optional
	OverMaxOutputTokens OverMaxOutputTokens `json:"overMaxOutputTokens,omitempty"`
}
