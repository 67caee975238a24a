// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package v1alpha1

// ProxyReference names the TokenProxy that a TokenBudget or an ApiKey belongs to.
type ProxyReference struct {
	// Name of the TokenProxy.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`
	// Namespace of the TokenProxy. Default: the object's own. A fleet in another
	// namespace accepts the object only when its spec.allowedNamespaces allows the
	// object's namespace.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	Namespace string `json:"namespace,omitempty"`
}

// SecretKeyReference selects one key of a Secret in the same namespace. The Secret
// must carry the label SecretUsageLabel (tokenwarden.io/secret) with the value of its
// use: api-key for an ApiKey, credential for a TokenProxy.
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
	// ConditionEnforced is True when every live replica of the fleet reports that it
	// has loaded a config generation that holds the object: for a TokenProxy, the
	// fleet's current config generation; for a TokenBudget or an ApiKey, the
	// generation that first held its current content (status.configGeneration). The
	// live replicas are the ones whose report Lease (ReplicaConfigMapLabel) is
	// renewed; there is no kubelet in the loop.
	ConditionEnforced = "Enforced"
	// ConditionDegraded, on a TokenProxy, is True while a step of the fleet's
	// reconcile fails (its reason names the step: ConfigMapFailed, RBACFailed,
	// DeploymentFailed, ServicesFailed, PodDisruptionBudgetFailed,
	// ServiceMonitorFailed, NetworkPolicyFailed or StatusFailed); the other steps still
	// run and the failed ones are retried with backoff. ReadFailed: what the fleet is
	// rendered from could not be read, so no step ran. False (Reconciled) otherwise.
	ConditionDegraded = "Degraded"
)

// The report each proxy replica of a fleet writes: a coordination.k8s.io/v1 Lease
// named <configmap>-<replica> in the fleet's namespace, renewed while the replica
// runs, whose annotations name the config it has applied.
const (
	// ReplicaConfigMapLabel on a replica's Lease names the ConfigMap the replica
	// serves (the fleet's <name>-proxy); the operator selects a fleet's Leases by it.
	ReplicaConfigMapLabel = "tokenwarden.io/configmap"
	// ReplicaGenerationAnnotation on a replica's Lease is the generation of the config
	// the replica has applied (the ConfigMap's ConfigGenerationAnnotation).
	ReplicaGenerationAnnotation = "tokenwarden.io/config-generation"
	// ReplicaDigestAnnotation on a replica's Lease is the SHA-256 of the config
	// document the replica has applied (/admin/effective's "digest").
	ReplicaDigestAnnotation = "tokenwarden.io/config-digest"
	// ReplicaDurableEpochsAnnotation on a replica's Lease is the epochs of the durable
	// counters the replica runs under, per slot group, as JSON:
	// [{"group", "epoch", "fenced", "found", "store_fence", "store_checks"}] (fenced:
	// Redis holds another epoch, or none, "found"; store_fence: what the store checks
	// fence the durable rules for; store_checks: [{"check", "result", "detail"}]).
	ReplicaDurableEpochsAnnotation = "tokenwarden.io/durable-epochs"
	// ReplicaUpstreamHealthAnnotation on a replica's Lease is the health of the model
	// registry's upstreams as the replica sees it, as JSON:
	// [{"upstream", "breaker", "cooling"}] (breaker: closed, open or half_open).
	ReplicaUpstreamHealthAnnotation = "tokenwarden.io/upstream-health"
)

// ConditionDurableBudgetsFenced is, on a TokenProxy with Redis storage, True while a
// live replica fences its calendar and cost budgets (503 budget_recovering): Redis
// does not hold the epoch of the durable counters the fleet runs under, because it
// restarted without its data or was flushed. The message names the replica and the
// recovery procedure (docs/runbooks.md). Reasons: CounterStateLost, Trusted.
const ConditionDurableBudgetsFenced = "DurableBudgetsFenced"

// Reasons of DurableBudgetsFenced.
const (
	ReasonCounterStateLost = "CounterStateLost"
	ReasonTrusted          = "Trusted"
)

// Reasons of the Events of an attestation from the spend ledger: ordered, and done
// (the new epoch recorded).
const (
	ReasonAttestingFromLedger = "AttestingFromLedger"
	ReasonAttestedFromLedger  = "AttestedFromLedger"
)

// ConditionStoreChecksFailed is, on a TokenProxy with Redis storage, True while a live
// replica reports a failed check of its Redis (spec.storage.redis.storeChecks): Redis
// may evict counters, the fleet's user may destroy them, a cluster stops serving
// every slot when a master fails, or keys were evicted. The message names the checks,
// the replicas and whether the calendar and cost budgets are fenced. Reasons:
// CheckFailed (reported only), FencedByCheck (Enforce mode, or keys evicted: the
// calendar and cost budgets answer 503), ChecksPass.
const ConditionStoreChecksFailed = "StoreChecksFailed"

// Reasons of StoreChecksFailed.
const (
	ReasonCheckFailed   = "CheckFailed"
	ReasonFencedByCheck = "FencedByCheck"
	ReasonChecksPass    = "ChecksPass"
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
	// NeedsRedis, InvalidBudget and ModelNotPriced refuse a TokenBudget
	// (Accepted=False) that its fleet cannot enforce: a calendar window or a Cost
	// amount on a fleet with memory storage; a budget the proxy would refuse; a Cost
	// budget for a model the fleet's spec.models gives no price.
	ReasonNeedsRedis     = "NeedsRedis"
	ReasonInvalidBudget  = "InvalidBudget"
	ReasonModelNotPriced = "ModelNotPriced"
	ReasonNotReady       = "DeploymentNotReady"

	// Enforced on a TokenBudget or an ApiKey: Enforced (every live replica has loaded
	// it), Pending (a replica has not yet, or none reports) or NotInConfig (the object
	// is not accepted, so no config holds it).
	ReasonEnforced    = "Enforced"
	ReasonNotInConfig = "NotInConfig"
	// Enforced on a TokenProxy: AllReplicasCurrent, ReplicasBehind (a live replica
	// runs an older config generation) or NoReplicas (no replica reports).
	ReasonAllReplicasCurrent = "AllReplicasCurrent"
	ReasonReplicasBehind     = "ReplicasBehind"
	ReasonNoReplicas         = "NoReplicas"
	// Degraded=False on a TokenProxy: every step of the reconcile succeeded.
	ReasonReconciled = "Reconciled"
	// Degraded=True on a TokenProxy: a ConfigMap the operator did not write holds the
	// name of one of the fleet's config chunks (the message names it); the operator
	// neither uses nor overwrites it, and the fleet keeps its last config.
	ReasonConfigChunkTaken = "ConfigChunkTaken"
)
