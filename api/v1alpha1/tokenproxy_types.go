// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// AuthMode says whether requests must carry a known API key.
// +kubebuilder:validation:Enum=Required;Optional
type AuthMode string

// Auth modes.
const (
	AuthRequired AuthMode = "Required"
	AuthOptional AuthMode = "Optional"
)

// StorageType is where a fleet keeps its buckets.
// +kubebuilder:validation:Enum=Memory;Redis
type StorageType string

// Storage types.
const (
	StorageMemory StorageType = "Memory"
	StorageRedis  StorageType = "Redis"
)

// Overage is what settlement does with usage beyond a reservation that a bucket
// cannot cover.
// +kubebuilder:validation:Enum=Debt;Forgive
type Overage string

// Overage rules.
const (
	// OverageDebt drives the bucket below zero, at most one capacity: the tenant repays
	// it by waiting.
	OverageDebt Overage = "Debt"
	// OverageForgive consumes nothing from a bucket that cannot cover the overage,
	// rather than draining it partly.
	OverageForgive Overage = "Forgive"
)

// Upstream is one OpenAI- or Anthropic-compatible backend.
type Upstream struct {
	// Name identifies the upstream in metrics and logs.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Name string `json:"name"`
	// URL is http(s)://host:port with an optional base path.
	// +required
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:XValidation:rule="self.startsWith('http://') || self.startsWith('https://')",message="url must start with http:// or https://"
	// +kubebuilder:validation:XValidation:rule="isURL(self) && url(self).getHostname() != ''",message="url must name a host, as in http://host:port"
	URL string `json:"url"`
	// Models are the client-facing model names this upstream serves; empty serves every
	// model no other upstream lists. A model is listed by one upstream only. (The
	// limits keep the API server's cost of that check within its budget.)
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=128
	Models []string `json:"models,omitempty"`
	// CredentialSecretRef selects the upstream's own API key, which the proxy sends
	// instead of the client's. Empty: none is sent.
	// +optional
	CredentialSecretRef *SecretKeyReference `json:"credentialSecretRef,omitempty"`
	// TimeoutSeconds bounds the wait for the upstream's response headers. Default 300.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=3600
	TimeoutSeconds int64 `json:"timeoutSeconds,omitempty"`
	// Capacity is what the upstream runs at once, per replica; at it, requests wait
	// in the proxy (scheduling). Default: no bound, nothing waits.
	// +optional
	Capacity *UpstreamCapacity `json:"capacity,omitempty"`
	// Provider is the API family the upstream speaks, OpenAI or Anthropic: a model's
	// failover stays within the request's family. Default: both.
	// +optional
	Provider Provider `json:"provider,omitempty"`
}

// Provider is the API family an upstream speaks.
// +kubebuilder:validation:Enum=OpenAI;Anthropic
type Provider string

// Providers.
const (
	ProviderOpenAI    Provider = "OpenAI"
	ProviderAnthropic Provider = "Anthropic"
)

// ModelUpstream is one upstream of a model, in the order they are tried.
type ModelUpstream struct {
	// Upstream is the name of an entry of spec.upstreams (its URL, credential and
	// provider).
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	Upstream string `json:"upstream"`
	// ProviderModel is the provider's own name of the model, sent upstream instead of
	// the client-facing name. Default: the client-facing name.
	// +optional
	// +kubebuilder:validation:MaxLength=256
	ProviderModel string `json:"providerModel,omitempty"`
	// Tokenizer is the encoding of the provider model behind this upstream, when it
	// differs from the model's tokenizer: o200k_base or cl100k_base. A model with a
	// tokenizer here or on itself counts its input with every upstream's encoding and
	// keeps the largest; each of its upstreams then needs one (an Anthropic upstream
	// cannot have one: the operator refuses it, InvalidConfig). Default: the model's.
	// +optional
	// +kubebuilder:validation:Enum=o200k_base;cl100k_base
	Tokenizer string `json:"tokenizer,omitempty"`
}

// ModelSpec is one client-facing model of a fleet.
type ModelSpec struct {
	// Name is the client-facing model name, as requests carry it.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=256
	Name string `json:"name"`
	// Price is what the model costs, for Cost budgets.
	// +optional
	Price *ModelPrice `json:"price,omitempty"`
	// ContextWindow is the model's context window in tokens, which input and output
	// share: a request that cannot fit is refused with 400 before any budget or
	// upstream sees it. Default: not checked.
	// +optional
	// +kubebuilder:validation:Minimum=0
	ContextWindow int64 `json:"contextWindow,omitempty"`
	// MaxOutputTokens is the most the model generates in one answer; a request asking
	// for more is refused with 400. Default: not checked.
	// +optional
	// +kubebuilder:validation:Minimum=0
	MaxOutputTokens int64 `json:"maxOutputTokens,omitempty"`
	// Upstreams serve the model, in the order they are tried: a request goes to the
	// first whose circuit breaker is closed and whose credential is not cooling down
	// after a 429, and moves to the next after an error before its answer began. A
	// model listed here is not listed in an upstream's models. Default: the upstream
	// that lists the model, else the one with no models.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=8
	Upstreams []ModelUpstream `json:"upstreams,omitempty"`
	// Tokenizer is the byte-pair encoding that counts the model's input in place of
	// the estimate, for its budgets and its context-window pre-check: o200k_base
	// (GPT-4o, GPT-4.1, GPT-5, the o-series) or cl100k_base (GPT-4, GPT-3.5).
	// Default: the estimate.
	// +optional
	// +kubebuilder:validation:Enum=o200k_base;cl100k_base
	Tokenizer string `json:"tokenizer,omitempty"`
	// AdmissionPolicy is what becomes of a request that asks for more output than
	// the model generates or its context window leaves after the input: Refuse (400)
	// or Clamp (forwarded with its output cap lowered to the room, when
	// acceptsLoweredOutputCap is true; refused otherwise). Default:
	// spec.routing.admissionPolicy.
	// +optional
	AdmissionPolicy AdmissionPolicy `json:"admissionPolicy,omitempty"`
	// AcceptsLoweredOutputCap declares that the model's providers answer a request
	// whose output cap was lowered as any other (a stop at the cap is a "length"
	// finish): only then does Clamp lower it. Default false.
	// +optional
	AcceptsLoweredOutputCap bool `json:"acceptsLoweredOutputCap,omitempty"`
	// UnavailableFallback is another model of spec.models, with upstreams, that
	// serves a request of this one when every upstream of this one is unavailable
	// (breakers open, credentials cooling), before any attempt and once: if the
	// request fits its window, one of its upstreams may take it and its budgets
	// admit it (they are charged). Default: none; such a request is answered 503.
	// +optional
	// +kubebuilder:validation:MaxLength=256
	UnavailableFallback string `json:"unavailableFallback,omitempty"`
}

// AdmissionPolicy is what becomes of a request whose stated output does not fit its
// model.
// +kubebuilder:validation:Enum=Refuse;Clamp
type AdmissionPolicy string

// Admission policies.
const (
	AdmissionRefuse AdmissionPolicy = "Refuse"
	AdmissionClamp  AdmissionPolicy = "Clamp"
)

// RoutingSpec holds a fleet's defaults for its models.
type RoutingSpec struct {
	// AdmissionPolicy is the admission policy of a model that names none: Refuse or
	// Clamp. Default Refuse.
	// +optional
	AdmissionPolicy AdmissionPolicy `json:"admissionPolicy,omitempty"`
	// BillingCooldownSeconds is how long an upstream's credential cools after its
	// provider answers that the account is out of credit, before a replica probes
	// it; the answer's own timing applies when it asks for longer. Default 900.
	// +optional
	// +kubebuilder:validation:Minimum=300
	// +kubebuilder:validation:Maximum=21600
	BillingCooldownSeconds int64 `json:"billingCooldownSeconds,omitempty"`
}

// ModelPrice is a model's price in US dollars per million tokens: quantities such as
// "2.50" or "10", 0 or more (the operator refuses a negative price: InvalidConfig).
type ModelPrice struct {
	// Input is the price of a million input tokens that were not read from a cache.
	// +required
	Input resource.Quantity `json:"input"`
	// Output is the price of a million generated tokens.
	// +required
	Output resource.Quantity `json:"output"`
	// CachedInput is the price of a million input tokens read from the backend's
	// prompt cache. Default: the input price.
	// +optional
	CachedInput *resource.Quantity `json:"cachedInput,omitempty"`
}

// AuthSpec configures client authentication.
type AuthSpec struct {
	// Mode is Required (a request without a known key is refused with 401) or Optional
	// (anonymous requests pass; the key, user and team budgets skip them). Default
	// Required.
	// +optional
	// +kubebuilder:default=Required
	Mode AuthMode `json:"mode,omitempty"`
	// TrustedProxies are CIDRs whose X-Forwarded-For header is believed.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=64
	// +kubebuilder:validation:items:XValidation:rule="isCIDR(self) || isIP(self)",message="must be a CIDR or an IP address"
	TrustedProxies []string `json:"trustedProxies,omitempty"`
}

// RedisSpec is the Redis server a fleet shares.
type RedisSpec struct {
	// URL is redis://host:port[/db] (rediss:// for TLS) for one server,
	// redis+cluster://host:port[,host:port...] for a Redis Cluster (the client finds
	// the other nodes from these), or
	// redis+sentinel://host:port[,host:port...]/MASTER[/db] for the primary the
	// sentinels name (rediss+cluster://, rediss+sentinel:// for TLS).
	// +required
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:XValidation:rule="self.matches('^rediss?([+]cluster|[+]sentinel)?://')",message="url must start with redis://, rediss://, redis+cluster://, rediss+cluster://, redis+sentinel:// or rediss+sentinel://"
	// +kubebuilder:validation:XValidation:rule="!self.matches('^rediss?[+]sentinel://[^/]*/?$')",message="a redis+sentinel:// url names the master after the sentinels: redis+sentinel://SENTINEL:26379/MASTER"
	URL string `json:"url"`
	// PasswordSecretRef selects the Redis password (the data nodes': the server, the
	// cluster's nodes, or the primary the sentinels name). Empty: the URL's, if any.
	// +optional
	PasswordSecretRef *SecretKeyReference `json:"passwordSecretRef,omitempty"`
	// SentinelPasswordSecretRef selects the sentinels' own password, for a
	// redis+sentinel:// url.
	// +optional
	SentinelPasswordSecretRef *SecretKeyReference `json:"sentinelPasswordSecretRef,omitempty"`
	// HotBudgetSlicePercent, from 0 to 50, serves the global and per-model token
	// budgets from slices of this percentage of their capacity that each replica leases
	// from Redis and spends locally (rate_limiting.redis.hot_budget_slice): one Redis
	// call per slice instead of one per request on the keys every request touches. The
	// fleet never admits more than a budget; replicas hold back at most a slice each
	// while busy. 0 or absent: off.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=50
	HotBudgetSlicePercent *int32 `json:"hotBudgetSlicePercent,omitempty"`
	// FallbackToMemory admits on each replica's own buckets, at its share, while Redis
	// is unreachable; false answers 503. Default true.
	// +optional
	// +kubebuilder:default=true
	FallbackToMemory *bool `json:"fallbackToMemory,omitempty"`
	// LedgerFallback, when set, lets the cost budgets counted by API key, user, team
	// or tenant answer from the fleet's PostgreSQL spend ledger (spec.ledger) while
	// Redis is unreachable: each replica admits on its share of what the ledger says
	// remains (rate_limiting.redis.ledger_fallback). The other calendar and cost
	// budgets, and every budget of a fleet without a PostgreSQL ledger, fail closed.
	// Absent: every calendar and cost budget fails closed while Redis is unreachable.
	// +optional
	LedgerFallback *RedisLedgerFallback `json:"ledgerFallback,omitempty"`
	// StoreChecks configure the proxies' checks of this Redis: maxmemory-policy
	// noeviction, no destructive command for the fleet's user, on a cluster
	// cluster-require-full-coverage no, and no keys evicted. A failed check sets
	// StoreChecksFailed. Default: Report mode, every 60 seconds, on the fleet's own
	// connection (which skips the checks its user may not run). A change applies
	// without restarting the proxies.
	// +optional
	StoreChecks *RedisStoreChecks `json:"storeChecks,omitempty"`
}

// RedisLedgerFallback configures the ledger fallback of the cost budgets.
type RedisLedgerFallback struct {
	// MaxConcurrent bounds the ledger sums each replica reads at once; a request that
	// finds none free, or whose sum takes more than a second, is answered 503 with
	// Retry-After. Default 4.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=64
	MaxConcurrent *int32 `json:"maxConcurrent,omitempty"`
}

// StoreCheckMode is what a failed store check does.
// +kubebuilder:validation:Enum=Report;Enforce
type StoreCheckMode string

// Store-check modes.
const (
	// StoreCheckReport reports a failed check: a metric, a log line and the
	// StoreChecksFailed condition.
	StoreCheckReport StoreCheckMode = "Report"
	// StoreCheckEnforce also fences the calendar and cost budgets (503
	// budget_recovering) while a check fails; token budgets are unaffected.
	StoreCheckEnforce StoreCheckMode = "Enforce"
)

// RedisStoreChecks configure the checks of the counters' Redis.
type RedisStoreChecks struct {
	// Mode is Report or Enforce. Evicted keys fence the calendar and cost budgets in
	// both modes, until their balances are attested. Default Report.
	// +optional
	Mode StoreCheckMode `json:"mode,omitempty"`
	// IntervalSeconds is how often the checks run after the first, at start. Default
	// 60.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=86400
	IntervalSeconds int32 `json:"intervalSeconds,omitempty"`
	// Username is the check credential's Redis user, one that may run CONFIG GET,
	// ACL DRYRUN and INFO (and on a cluster CLUSTER SLOTS). Empty with a
	// passwordSecretRef: the default user. Both empty: the fleet's own connection.
	// +optional
	// +kubebuilder:validation:MaxLength=256
	Username string `json:"username,omitempty"`
	// PasswordSecretRef selects the check credential's password.
	// +optional
	PasswordSecretRef *SecretKeyReference `json:"passwordSecretRef,omitempty"`
}

// StorageSpec says where the fleet keeps its buckets.
// +kubebuilder:validation:XValidation:rule="!has(self.redis) || !has(self.redis.sentinelPasswordSecretRef) || self.redis.url.matches('^rediss?[+]sentinel://')",message="redis.sentinelPasswordSecretRef needs a redis+sentinel:// url"
// +kubebuilder:validation:XValidation:rule="self.type == 'Redis' ? has(self.redis) : !has(self.redis)",message="redis is required when type is Redis and must not be set otherwise"
type StorageSpec struct {
	// Type is Memory (each replica enforces its share of every budget) or Redis (the
	// replicas share buckets). Default Memory.
	// +optional
	// +kubebuilder:default=Memory
	Type StorageType `json:"type,omitempty"`
	// Redis is the shared server, for type Redis.
	// +optional
	Redis *RedisSpec `json:"redis,omitempty"`
}

// TokenProxySpec is a fleet of budget-enforcing proxies.
// +kubebuilder:validation:XValidation:rule="!has(self.serviceMonitorSpec) || (has(self.serviceMonitor) && self.serviceMonitor)",message="serviceMonitorSpec needs serviceMonitor: true"
// +kubebuilder:validation:XValidation:rule="!has(self.cache) || !has(self.cache.redis) || !has(self.storage) || !has(self.storage.redis) || self.cache.redis.url != self.storage.redis.url",message="cache.redis.url must name a Redis of the cache's own, not spec.storage.redis.url: the counters' Redis must never evict"
type TokenProxySpec struct {
	// Replicas is the number of proxy pods; every budget is divided among them under
	// memory storage. An HPA may scale it through the scale subresource. Default 1.
	// +optional
	// +kubebuilder:default=1
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=1000
	Replicas *int32 `json:"replicas,omitempty"`
	// Image is the proxy image. Default: the operator's --proxy-image.
	// +optional
	// +kubebuilder:validation:MaxLength=512
	Image string `json:"image,omitempty"`
	// Upstreams are the backends, chosen by the request's model.
	// +required
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:XValidation:rule="self.all(a, !has(a.models) || self.all(b, a.name == b.name || !has(b.models) || !sets.intersects(a.models, b.models)))",message="a model is listed by two upstreams; list each model under one upstream only"
	Upstreams []Upstream `json:"upstreams"`
	// Models are the client-facing models with what they cost: the prices a Cost
	// TokenBudget counts in. A Cost budget is accepted only when every model it
	// governs has a price here.
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=256
	Models []ModelSpec `json:"models,omitempty"`
	// Routing holds the fleet's defaults for its models: the admission policy.
	// +optional
	Routing RoutingSpec `json:"routing,omitempty"`
	// CachedInputWeight is how much an input token read from the backend's prompt
	// cache counts in Tokens and InputTokens budgets: from 0 to 1, for example 0.1.
	// Default 1 (a cached token counts in full). Cost budgets use the model's
	// cachedInput price instead.
	// +optional
	// +kubebuilder:validation:XValidation:rule="!quantity(string(self)).isLessThan(quantity('0')) && !quantity(string(self)).isGreaterThan(quantity('1'))",message="cachedInputWeight must be from 0 to 1"
	CachedInputWeight *resource.Quantity `json:"cachedInputWeight,omitempty"`
	// Auth configures client authentication.
	// +optional
	Auth AuthSpec `json:"auth,omitempty"`
	// AllowedNamespaces are the namespaces whose TokenBudgets and ApiKeys the fleet
	// accepts (issue 13, scoped reads). Default: its own namespace only.
	// +optional
	AllowedNamespaces AllowedNamespaces `json:"allowedNamespaces,omitempty"`
	// Tenancy is Namespaces (each accepted namespace other than the fleet's is a
	// tenant: its TokenBudgets apply only to its own keys, its keys' teams and users are
	// qualified by its namespace) or Flat (every accepted TokenBudget applies to the
	// whole fleet). Unset: what status.tenancy records, which is Namespaces for a fleet
	// first reconciled by an operator that knows this field and Flat for one reconciled
	// before it. The schema sets no default: a default would also apply to the fleets
	// stored before it, whose budgets would change meaning on the upgrade.
	// +optional
	Tenancy Tenancy `json:"tenancy,omitempty"`
	// AllowBypass says which of the fleet's ApiKeys may set bypass: None, Same (keys
	// in the fleet's namespace) or All (keys in every allowed namespace). Default None.
	// +optional
	// +kubebuilder:default=None
	AllowBypass BypassPolicy `json:"allowBypass,omitempty"`
	// MaxTenantKeyWeight is the largest scheduling weight (an ApiKey's spec.weight) a
	// key of another namespace than the fleet's may set; a key that sets more is not
	// accepted (reason WeightNotAllowed). Unset: 1 under tenancy Namespaces, so that no
	// tenant raises its keys' share of service over another tenant's; no bound under
	// Flat, as before tenancy. The fleet's own keys may set any weight.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1000
	MaxTenantKeyWeight *int32 `json:"maxTenantKeyWeight,omitempty"`
	// Storage says where the buckets live. Default Memory.
	// +optional
	Storage StorageSpec `json:"storage,omitempty"`
	// Whitelist are client CIDRs exempt from every limit.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=64
	// +kubebuilder:validation:items:XValidation:rule="isCIDR(self) || isIP(self)",message="must be a CIDR or an IP address"
	Whitelist []string `json:"whitelist,omitempty"`
	// Overage is what settlement does with usage beyond a reservation that a bucket
	// cannot cover: Debt (the bucket goes below zero, at most one capacity, and the
	// tenant repays it by waiting) or Forgive (it consumes nothing rather than drain
	// the bucket partly; an undercounted request is then partly free). Default Debt.
	// +optional
	// +kubebuilder:default=Debt
	Overage Overage `json:"overage,omitempty"`
	// ClientIPv6PrefixLength groups IPv6 clients for PerClient budgets: every address in
	// one prefix of this length is one client, so a client cannot take a fresh budget
	// from each address of its /64. IPv4 clients are one per address. Default 64.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=128
	ClientIPv6PrefixLength int32 `json:"clientIPv6PrefixLength,omitempty"`
	// MaxAttributeValues bounds the distinct values of an attribute a client sends
	// (Session, Agent, Task, Run, RequestFingerprint) that a budget counting by it
	// holds per API key per window; the values beyond count together in one overflow
	// subject of the key, so a client that invents ids cannot fill the counters'
	// memory or Redis. Default 1000.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1000000
	MaxAttributeValues int64 `json:"maxAttributeValues,omitempty"`
	// RetryPatienceSeconds is the longest wait a refusal asks a client to make: a 429
	// whose Retry-After is longer, or whose request is larger than its whole budget, also
	// says x-should-retry: false, so the official SDKs fail at once instead of sleeping.
	// Default 60.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=86400
	RetryPatienceSeconds int64 `json:"retryPatienceSeconds,omitempty"`
	// MaxBodyBytes is the largest request body accepted; larger get 413. Default 16 MiB.
	// +optional
	// +kubebuilder:validation:Minimum=1024
	MaxBodyBytes int64 `json:"maxBodyBytes,omitempty"`
	// ServiceMonitor creates a Prometheus Operator ServiceMonitor for the fleet when
	// that CRD is installed. Default false.
	// +optional
	ServiceMonitor bool `json:"serviceMonitor,omitempty"`
	// Resources of the proxy container.
	// +optional
	Resources corev1.ResourceRequirements `json:"resources,omitempty"`
	// NodeSelector of the proxy pods.
	// +optional
	NodeSelector map[string]string `json:"nodeSelector,omitempty"`
	// Tolerations of the proxy pods.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=32
	Tolerations []corev1.Toleration `json:"tolerations,omitempty"`
	// PodAnnotations are added to the proxy pods.
	// +optional
	PodAnnotations map[string]string `json:"podAnnotations,omitempty"`

	// PodLabels are added to the proxy pods, under the operator's selector labels
	// (app.kubernetes.io/name and app.kubernetes.io/instance), which win.
	// +optional
	// +kubebuilder:validation:MaxProperties=64
	PodLabels map[string]string `json:"podLabels,omitempty"`
	// ImagePullSecrets of the proxy pods, in their namespace.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=16
	ImagePullSecrets []corev1.LocalObjectReference `json:"imagePullSecrets,omitempty"`
	// Affinity of the proxy pods. Default none.
	// +optional
	Affinity *corev1.Affinity `json:"affinity,omitempty"`
	// TopologySpreadConstraints of the proxy pods. A constraint without a labelSelector
	// gets the pods' selector labels, so it spreads this fleet's pods. Default none.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=8
	TopologySpreadConstraints []corev1.TopologySpreadConstraint `json:"topologySpreadConstraints,omitempty"`
	// NetworkPolicy restricts who reaches the proxy pods. Default: no NetworkPolicy.
	// +optional
	NetworkPolicy NetworkPolicySpec `json:"networkPolicy,omitempty"`
	// ServiceMonitorSpec sets the labels and scrape interval of the fleet's
	// ServiceMonitor (spec.serviceMonitor must be true).
	// +optional
	ServiceMonitorSpec *ServiceMonitorSpec `json:"serviceMonitorSpec,omitempty"`
	// Scheduling orders requests waiting for an upstream's capacity, bounds their
	// waits and caps each class's output (scheduling_types.go).
	// +optional
	Scheduling *SchedulingSpec `json:"scheduling,omitempty"`
	// Observability configures the proxies' access log, tracing and refusal audit.
	// Default: the access log on, tracing off, 20 refusals kept per key.
	// +optional
	Observability *ObservabilitySpec `json:"observability,omitempty"`
	// Ledger records every settlement in a PostgreSQL database the replicas share,
	// for audit and chargeback reports (ledger_types.go). Default: the operator's
	// default ledger, if it has one; otherwise none.
	// +optional
	Ledger *LedgerSpec `json:"ledger,omitempty"`
	// Cache answers identical requests without a backend call (cache_types.go).
	// Default: off.
	// +optional
	Cache *CacheSpec `json:"cache,omitempty"`
}

// NetworkPolicySpec is the fleet's NetworkPolicy, <name>-proxy, on the proxy pods'
// ingress: the client port (8080) from clientFrom, or from anywhere when it is empty;
// the admin port (9090: /metrics, /admin/*, the probes' endpoints) from adminFrom only.
type NetworkPolicySpec struct {
	// Enabled creates the NetworkPolicy; false deletes it. Default false.
	// +optional
	Enabled bool `json:"enabled,omitempty"`
	// ClientFrom are the peers allowed to reach the client port. Empty: every peer.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=32
	ClientFrom []networkingv1.NetworkPolicyPeer `json:"clientFrom,omitempty"`
	// AdminFrom are the peers allowed to reach the admin port, for example the
	// monitoring namespace's Prometheus. Empty: none (the kubelet's probes are not
	// subject to NetworkPolicy on most network plugins).
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=32
	AdminFrom []networkingv1.NetworkPolicyPeer `json:"adminFrom,omitempty"`
}

// ServiceMonitorSpec is what the fleet's ServiceMonitor carries besides its endpoint.
type ServiceMonitorSpec struct {
	// Labels are added to the ServiceMonitor, under the operator's own labels, which
	// win: for a Prometheus whose serviceMonitorSelector needs them (kube-prometheus-stack
	// selects release: <its release name>).
	// +optional
	// +kubebuilder:validation:MaxProperties=32
	Labels map[string]string `json:"labels,omitempty"`
	// Interval between scrapes, a Prometheus duration such as 30s or 1m. Default 15s.
	// +optional
	// +kubebuilder:validation:MaxLength=16
	// +kubebuilder:validation:Pattern=`^(0|(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$`
	Interval string `json:"interval,omitempty"`
}

// TokenProxyStatus is what the operator observed of the fleet.
type TokenProxyStatus struct {
	// ObservedGeneration is the generation this status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Replicas is the number of proxy pods (the scale subresource's status).
	// +optional
	Replicas int32 `json:"replicas"`
	// ReadyReplicas is the number of ready proxy pods.
	// +optional
	ReadyReplicas int32 `json:"readyReplicas"`
	// Selector is the pods' label selector, for the scale subresource.
	// +optional
	Selector string `json:"selector,omitempty"`
	// Divisor is the budget division in force: max(spec.replicas, status.replicas)
	// of the Deployment under memory storage.
	// +optional
	Divisor int64 `json:"divisor,omitempty"`
	// Storage is the storage in force.
	// +optional
	Storage StorageType `json:"storage,omitempty"`
	// Tenancy is the tenancy in force: spec.tenancy, or, while that is unset, the one
	// recorded at the fleet's first reconcile (Namespaces for a new fleet, Flat for a
	// fleet that an earlier operator had reconciled).
	// +optional
	Tenancy Tenancy `json:"tenancy,omitempty"`
	// Budgets and Keys count the accepted TokenBudgets and ApiKeys in the config.
	// +optional
	Budgets int32 `json:"budgets,omitempty"`
	// +optional
	Keys int32 `json:"keys,omitempty"`
	// ConfigGeneration is the generation of the rendered proxy config.
	// +optional
	ConfigGeneration int64 `json:"configGeneration,omitempty"`
	// LiveReplicas is the number of proxy replicas that report themselves: their
	// report Leases are renewed. It may differ from replicas (the Deployment's pods)
	// while pods start or stop, or when the proxies do not run as the Deployment.
	// +optional
	LiveReplicas int32 `json:"liveReplicas"`
	// EnforcedReplicas is the number of live replicas that have loaded the current
	// config generation (configGeneration) or a later one.
	// +optional
	EnforcedReplicas int32 `json:"enforcedReplicas"`
	// Enforced is "enforcedReplicas/liveReplicas", for kubectl get.
	// +optional
	Enforced string `json:"enforced,omitempty"`
	// DurableEpochs are the epochs of the fleet's durable counters (calendar windows
	// and cost budgets, kept in Redis), one per slot group (the fleet's Redis key
	// prefix), recorded from the replicas' reports (their Leases'
	// tokenwarden.io/durable-epochs) and rendered into their config
	// (rate_limiting.redis.epoch). A replica whose Redis does not hold its group's
	// epoch has lost counter state and fences those budgets (DurableBudgetsFenced). The
	// operator records a group's first reported epoch, and then only a newer one (an
	// attestation's).
	// +optional
	// +listType=map
	// +listMapKey=group
	// +kubebuilder:validation:MaxItems=16
	DurableEpochs []DurableEpoch `json:"durableEpochs,omitempty"`
	// Upstreams is "healthy/total" of the fleet's upstreams, for kubectl get: an
	// upstream is unhealthy while a live replica reports its circuit breaker open or
	// its credential cooling down after a 429 or a billing error (unhealthyUpstreams
	// says which).
	// +optional
	Upstreams string `json:"upstreams,omitempty"`
	// UpstreamsOut names, for kubectl get, each unhealthy upstream with what keeps it
	// out, the gravest first: "anthropic=billing,azure=breaker,openai=rate"
	// (billing: its provider account is out of credit; breaker: it keeps failing;
	// rate: its credential cools after a 429 of rate pressure).
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	UpstreamsOut string `json:"upstreamsOut,omitempty"`
	// UnhealthyUpstreams are the upstreams a live replica reports unhealthy.
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=32
	UnhealthyUpstreams []UnhealthyUpstream `json:"unhealthyUpstreams,omitempty"`
	// Conditions: Accepted, Ready, Enforced (every live replica runs the current
	// config generation), Degraded (a step of the reconcile fails) and, with Redis
	// storage, DurableBudgetsFenced (a replica refuses calendar and cost budgets
	// until their balances are restored or attested) and StoreChecksFailed (a
	// replica's checks of Redis fail), and, with a ledger, LedgerSpooling (a
	// replica's settlements wait in its spool).
	// +optional
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=12
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// UnhealthyUpstream is an upstream that live replicas report unhealthy.
type UnhealthyUpstream struct {
	// Name is the upstream's name in spec.upstreams.
	// +required
	// +kubebuilder:validation:MaxLength=63
	Name string `json:"name"`
	// OpenReplicas is the number of live replicas whose breaker for it is open or
	// half-open.
	// +optional
	OpenReplicas int32 `json:"openReplicas,omitempty"`
	// CoolingReplicas is the number of live replicas whose credential for it cools
	// down after a 429 of rate pressure.
	// +optional
	CoolingReplicas int32 `json:"coolingReplicas,omitempty"`
	// BillingReplicas is the number of live replicas whose credential for it is on a
	// billing cooldown: the provider said its account is out of credit. It holds
	// until a probe finds the account answering again.
	// +optional
	BillingReplicas int32 `json:"billingReplicas,omitempty"`
	// Reason is what keeps it out, the gravest a replica reports: Billing, Breaker or
	// Rate.
	// +optional
	// +kubebuilder:validation:Enum=Billing;Breaker;Rate
	Reason string `json:"reason,omitempty"`
	// Message is the provider's message of the billing cooldown, as a replica reports
	// it.
	// +optional
	// +kubebuilder:validation:MaxLength=512
	Message string `json:"message,omitempty"`
	// RequestedSeconds is the interval the provider's answer asked for, of the
	// cooldown that Reason names (0: it gave no timing), and AppliedSeconds the one
	// applied.
	// +optional
	RequestedSeconds int64 `json:"requestedSeconds,omitempty"`
	// +optional
	AppliedSeconds int64 `json:"appliedSeconds,omitempty"`
}

// DurableEpoch is the epoch of one slot group's durable counters.
type DurableEpoch struct {
	// Group is the slot group: the fleet's Redis key prefix.
	// +kubebuilder:validation:MaxLength=253
	Group string `json:"group"`
	// Epoch is "<created Unix milliseconds on the Redis clock>-<random hex>".
	// +kubebuilder:validation:MaxLength=100
	Epoch string `json:"epoch"`
	// LedgerAttestation is set while the group's counters are lost (a live replica
	// is fenced because Redis holds none or an older one of this epoch) and every live
	// replica has flushed its spend ledger past the loss: the operator renders it into
	// the config (rate_limiting.redis.ledger_attestation), and one replica attests the
	// counters from the ledger, which writes a newer epoch.
	// +optional
	LedgerAttestation *LedgerAttestation `json:"ledgerAttestation,omitempty"`
}

// LedgerAttestation is the fleet's word that a group's lost counters may be attested
// from its spend ledger.
type LedgerAttestation struct {
	// FlushedThrough is the least of the live replicas' flushed-through times: every
	// settlement before it is in the ledger.
	FlushedThrough metav1.Time `json:"flushedThrough"`
}

// Condition reasons of a TokenProxy.
const (
	// ReasonInvalidConfig: the rendered proxy config fails the proxy's own validation,
	// so it is not written and the proxies keep the last good one (Accepted=False).
	ReasonInvalidConfig = "InvalidConfig"
	// ReasonCredentialSecretNotFound: a Secret the proxy pods read a credential from
	// does not exist (Accepted=False).
	ReasonCredentialSecretNotFound = "CredentialSecretNotFound"
	// ReasonCredentialSecretKeyMissing: a credential Secret lacks the key referenced
	// (Accepted=False).
	ReasonCredentialSecretKeyMissing = "CredentialSecretKeyMissing"
)

// TokenProxy is a fleet of proxies that keeps LLM traffic inside token budgets.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:subresource:scale:specpath=.spec.replicas,statuspath=.status.replicas,selectorpath=.status.selector
// +kubebuilder:resource:shortName=tp,categories=tokenwarden
// +kubebuilder:validation:XValidation:rule="size(self.metadata.name) <= 51 && self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')",message="metadata.name must be a DNS label of at most 51 characters that starts with a letter: the fleet's Services are named <name>-proxy and <name>-proxy-admin (at most 63)"
// +kubebuilder:printcolumn:name="Replicas",type=integer,JSONPath=`.spec.replicas`
// +kubebuilder:printcolumn:name="Ready",type=integer,JSONPath=`.status.readyReplicas`
// +kubebuilder:printcolumn:name="Storage",type=string,JSONPath=`.spec.storage.type`
// +kubebuilder:printcolumn:name="Budgets",type=integer,JSONPath=`.status.budgets`
// +kubebuilder:printcolumn:name="Keys",type=integer,JSONPath=`.status.keys`
// +kubebuilder:printcolumn:name="Enforced",type=string,JSONPath=`.status.enforced`
// +kubebuilder:printcolumn:name="Upstreams",type=string,JSONPath=`.status.upstreams`
// +kubebuilder:printcolumn:name="Out",type=string,JSONPath=`.status.upstreamsOut`
// +kubebuilder:printcolumn:name="Tenancy",type=string,JSONPath=`.status.tenancy`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type TokenProxy struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +required
	Spec TokenProxySpec `json:"spec"`
	// +optional
	Status TokenProxyStatus `json:"status,omitempty"`
}

// TokenProxyList is a list of TokenProxies.
// +kubebuilder:object:root=true
type TokenProxyList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []TokenProxy `json:"items"`
}
