// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package v1alpha1

import "k8s.io/apimachinery/pkg/api/resource"

// CacheScope is whose answers a cache hit may serve.
// +kubebuilder:validation:Enum=APIKey;Team;Fleet
type CacheScope string

// Cache scopes.
const (
	// CacheScopeAPIKey serves an answer only to the API key that caused it.
	CacheScopeAPIKey CacheScope = "APIKey"
	// CacheScopeTeam serves it to every key of the same team.
	CacheScopeTeam CacheScope = "Team"
	// CacheScopeFleet serves it to every caller of the fleet.
	CacheScopeFleet CacheScope = "Fleet"
)

// CacheRoute is a charged route a cache may serve.
// +kubebuilder:validation:Enum="/v1/chat/completions";"/v1/completions";"/v1/responses";"/v1/responses/compact";"/v1/messages";"/anthropic/v1/messages"
type CacheRoute string

// CacheSpec answers identical requests without a backend call: from a stored answer,
// or by waiting for an identical request in flight (docs/cache.md). A hit charges no
// tokens and no dollars; request-count limits still count it.
// +kubebuilder:validation:XValidation:rule="has(self.storage) && self.storage == 'Redis' ? has(self.redis) : !has(self.redis)",message="redis is required when storage is Redis and must not be set otherwise"
// +kubebuilder:validation:XValidation:rule="!has(self.memorySize) || (has(self.storage) && self.storage == 'Memory')",message="memorySize applies only to storage Memory"
type CacheSpec struct {
	// Storage is where answers are kept: Memory (each proxy pod its own, least
	// recently used dropped past memorySize) or Redis (a Redis of the cache's own,
	// shared by the fleet). Default: none (answers are not kept; coalesce may still
	// be on).
	// +optional
	Storage StorageType `json:"storage,omitempty"`
	// MemorySize bounds a Memory store in each pod; keep it well within the pods'
	// memory limit. Default 64Mi.
	// +optional
	// +kubebuilder:validation:XValidation:rule="!quantity(string(self)).isLessThan(quantity('1Mi'))",message="memorySize must be at least 1Mi"
	MemorySize *resource.Quantity `json:"memorySize,omitempty"`
	// Redis is the cache's own Redis, for storage Redis: never spec.storage.redis,
	// whose counters must not be evicted, while the cache's may be (allkeys-lru).
	// +optional
	Redis *CacheRedisSpec `json:"redis,omitempty"`
	// TTLSeconds is how long a stored answer is served, in seconds. Default 300.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=604800
	TTLSeconds int64 `json:"ttlSeconds,omitempty"`
	// Scope is whose answers a hit may serve: APIKey (only the key that caused the
	// answer), Team (every key of its team) or Fleet (every caller). Team and Fleet
	// share answers between callers. Default APIKey.
	// +optional
	Scope CacheScope `json:"scope,omitempty"`
	// MaxEntrySize is the largest answer stored, and the most of an answer in flight
	// kept for the requests that wait for it. Default 1Mi.
	// +optional
	// +kubebuilder:validation:XValidation:rule="!quantity(string(self)).isLessThan(quantity('1')) && !quantity(string(self)).isGreaterThan(quantity('64Mi'))",message="maxEntrySize must be from 1 to 64Mi"
	MaxEntrySize *resource.Quantity `json:"maxEntrySize,omitempty"`
	// Models, when set, are the only client-facing models served. Default: every.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=256
	// +kubebuilder:validation:items:MaxLength=256
	Models []string `json:"models,omitempty"`
	// APIKeys, when set, are the only ApiKeys (by name, in the fleet's namespace)
	// served. Default: every.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=256
	// +kubebuilder:validation:items:MaxLength=253
	APIKeys []string `json:"apiKeys,omitempty"`
	// Routes, when set, are the only charged routes served. Default: every.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=6
	Routes []CacheRoute `json:"routes,omitempty"`
	// Coalesce makes an identical request wait for one in flight rather than call the
	// upstream. Default: true when storage is set; true turns it on without storage.
	// +optional
	Coalesce *bool `json:"coalesce,omitempty"`
}

// CacheRedisSpec is the cache's own Redis.
type CacheRedisSpec struct {
	// URL is written as spec.storage.redis.url is, and names another server.
	// +required
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:XValidation:rule="self.matches('^rediss?([+]cluster|[+]sentinel)?://')",message="url must start with redis://, rediss://, redis+cluster://, rediss+cluster://, redis+sentinel:// or rediss+sentinel://"
	URL string `json:"url"`
	// PasswordSecretRef selects the cache Redis' password. Empty: the URL's, if any.
	// +optional
	PasswordSecretRef *SecretKeyReference `json:"passwordSecretRef,omitempty"`
	// TimeoutMillis bounds each call to the cache, dial included: a slower cache is
	// a miss. Default 50.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=10000
	TimeoutMillis int64 `json:"timeoutMillis,omitempty"`
}
