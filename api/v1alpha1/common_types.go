// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package v1alpha1

// ProxyReference names the TokenProxy (in the same namespace) that a TokenBudget or an
// ApiKey belongs to.
type ProxyReference struct {
	// Name of the TokenProxy.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`
}

// SecretKeyReference selects one key of a Secret in the same namespace.
type SecretKeyReference struct {
	// Name of the Secret.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`
	// Key within the Secret's data. Default "key".
	// +optional
	// +kubebuilder:default=key
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Key string `json:"key,omitempty"`
}

// ConfigGenerationAnnotation on a fleet's ConfigMap (named after the TokenProxy, with
// the suffix "-proxy") is the generation of the proxy config the ConfigMap holds: a
// number that grows by one with every change of the rendered document. Each proxy
// reports the generation it has applied at /admin/effective ("generation"). The
// operator writes the ConfigMap before the statuses, so once the TokenProxy and every
// TokenBudget and ApiKey of the fleet show their current generation observed, a proxy
// whose generation has reached this one enforces them.
const ConfigGenerationAnnotation = "tokenwarden.io/config-generation"

// Condition types shared by the three resources.
const (
	// ConditionAccepted is True when the object is valid and in force: its references
	// resolve and it does not conflict with another object.
	ConditionAccepted = "Accepted"
	// ConditionReady is True when what the object asks for is served: for a TokenProxy,
	// its pods are ready; for a TokenBudget or an ApiKey, the rendered config that
	// holds it is in the fleet's ConfigMap.
	ConditionReady = "Ready"
)

// Condition reasons.
const (
	ReasonAccepted         = "Accepted"
	ReasonConflicted       = "Conflicted"
	ReasonProxyNotFound    = "ProxyNotFound"
	ReasonSecretNotFound   = "SecretNotFound"
	ReasonSecretKeyMissing = "SecretKeyMissing"
	ReasonRendered         = "Rendered"
	ReasonPending          = "Pending"
	ReasonDeploymentReady  = "DeploymentReady"
	ReasonNotReady         = "DeploymentNotReady"
)
