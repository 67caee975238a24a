// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package config

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"
)

// Cache answers a request without a backend call: from a stored answer, or from an
// identical request in flight (docs/cache.md). Absent, it is off: nothing is stored
// and no request waits for another.
type Cache struct {
	// Storage is where answers are kept: memory (each replica its own, least recently
	// used dropped past memory_bytes) or redis (one Redis of the cache's own, shared by
	// the fleet). Absent: no answer is kept (coalescing may still be on).
	Storage string `json:"storage,omitempty"`
	// MemoryBytes bounds a memory store, in bytes; keep it well within the pod's
	// memory limit. Absent or 0: 64 MiB.
	MemoryBytes int64 `json:"memory_bytes,omitempty"`
	// Redis is the cache's own Redis (storage redis): never the budget counters'.
	Redis CacheRedis `json:"redis,omitzero"`
	// TTLSeconds is how long a stored answer is served. Absent or 0: 300.
	TTLSeconds int64 `json:"ttl_seconds,omitempty"`
	// Scope is whose answers a hit may serve: api_key (the default: only the key that
	// caused the answer), team (every key of its team) or fleet (every caller). A wider
	// scope shares answers between callers.
	Scope string `json:"scope,omitempty"`
	// MaxEntryBytes is the largest answer stored, and the most of an answer a request
	// in flight keeps for the requests that wait for it. Absent or 0: 1 MiB.
	MaxEntryBytes int64 `json:"max_entry_bytes,omitempty"`
	// Models, APIKeys and Routes select the requests served: each list, when set,
	// admits only what it names (client-facing model names, API key names, charged
	// routes from CacheRoutes); absent, every one.
	Models  []string `json:"models,omitempty"`
	APIKeys []string `json:"api_keys,omitempty"`
	Routes  []string `json:"routes,omitempty"`
	// Coalesce makes an identical request wait for one in flight rather than call the
	// upstream. Absent: on when storage is set; true turns it on without storage.
	Coalesce *bool `json:"coalesce,omitempty"`
}

// CacheRedis is the cache's own Redis.
type CacheRedis struct {
	// URL is written as rate_limiting.redis.url is (redis://, rediss://,
	// redis+cluster://, redis+sentinel://), and must name another server: the
	// counters' Redis must not evict, the cache's may (allkeys-lru).
	URL string `json:"url,omitempty"`
	// PasswordEnv names an environment variable holding the password.
	PasswordEnv string `json:"password_env,omitempty"`
	// TimeoutMillis bounds each call, dial included: a slower cache is a miss.
	// Absent or 0: 50.
	TimeoutMillis int64 `json:"timeout_ms,omitempty"`
}

// Cache storages and scopes.
const (
	CacheMemoryStorage = "memory"
	CacheRedisStorage  = "redis"

	CacheScopeAPIKey = "api_key"
	CacheScopeTeam   = "team"
	CacheScopeFleet  = "fleet"
)

// Cache defaults and bounds.
const (
	DefaultCacheMemoryBytes   = 64 << 20
	DefaultCacheTTLSeconds    = 300
	DefaultCacheMaxEntryBytes = 1 << 20
	DefaultCacheTimeoutMillis = 50
	maxCacheTTLSeconds        = 7 * 24 * 3600
	maxCacheEntryBytes        = 64 << 20
	minCacheMemoryBytes       = 1 << 20
	maxCacheListLen           = 1000
)

// CacheRoutes are the routes a cache may serve: the charged ones.
var CacheRoutes = []string{
	"/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/responses/compact",
	"/v1/messages", "/anthropic/v1/messages",
}

// Stores reports whether answers are stored.
func (c *Cache) Stores() bool { return c.Storage != "" }

// Coalesces reports whether identical requests in flight are joined.
func (c *Cache) Coalesces() bool {
	if c.Coalesce != nil {
		return *c.Coalesce
	}
	return c.Stores()
}

// Enabled reports whether the cache does anything.
func (c *Cache) Enabled() bool { return c.Stores() || c.Coalesces() }

// TTL is ttl_seconds in force.
func (c *Cache) TTL() time.Duration {
	return time.Duration(cmp.Or(c.TTLSeconds, DefaultCacheTTLSeconds)) * time.Second
}

// StoreBytes is memory_bytes in force.
func (c *Cache) StoreBytes() int64 { return cmp.Or(c.MemoryBytes, DefaultCacheMemoryBytes) }

// EntryBytes is max_entry_bytes in force.
func (c *Cache) EntryBytes() int64 { return cmp.Or(c.MaxEntryBytes, DefaultCacheMaxEntryBytes) }

// Timeout is redis.timeout_ms in force.
func (c *CacheRedis) Timeout() time.Duration {
	return time.Duration(cmp.Or(c.TimeoutMillis, DefaultCacheTimeoutMillis)) * time.Millisecond
}

// ScopeOrDefault is scope in force.
func (c *Cache) ScopeOrDefault() string { return cmp.Or(c.Scope, CacheScopeAPIKey) }

// Serves reports whether the lists admit a request on route for model by key.
func (c *Cache) Serves(route, model, key string) bool {
	in := func(list []string, v string) bool { return len(list) == 0 || slices.Contains(list, v) }
	return in(c.Routes, route) && in(c.Models, model) && in(c.APIKeys, key)
}

func (c *Config) validateCache(errs *fieldErrors) {
	k := &c.Cache
	switch k.Storage {
	case "", CacheMemoryStorage, CacheRedisStorage:
	default:
		errs.add("cache.storage", "must be %q or %q, got %q", CacheMemoryStorage, CacheRedisStorage, k.Storage)
	}
	if k.MemoryBytes != 0 {
		switch {
		case k.Storage != CacheMemoryStorage:
			errs.add("cache.memory_bytes", "applies only to storage: memory")
		case k.MemoryBytes < minCacheMemoryBytes:
			errs.add("cache.memory_bytes", "must be at least %d (1 MiB), got %d", minCacheMemoryBytes, k.MemoryBytes)
		}
	}
	c.validateCacheRedis(errs)
	if k.TTLSeconds < 0 || k.TTLSeconds > maxCacheTTLSeconds {
		errs.add("cache.ttl_seconds", "must be from 1 to %d (a week), got %d", maxCacheTTLSeconds, k.TTLSeconds)
	}
	switch k.Scope {
	case "", CacheScopeAPIKey, CacheScopeTeam, CacheScopeFleet:
	default:
		errs.add("cache.scope", "must be %q, %q or %q, got %q", CacheScopeAPIKey, CacheScopeTeam, CacheScopeFleet, k.Scope)
	}
	if e := k.MaxEntryBytes; e < 0 || e > maxCacheEntryBytes {
		errs.add("cache.max_entry_bytes", "must be from 1 to %d (64 MiB), got %d", maxCacheEntryBytes, e)
	} else if k.Storage == CacheMemoryStorage && k.EntryBytes() > k.StoreBytes() {
		errs.add("cache.max_entry_bytes", "%d is more than the store holds (memory_bytes %d)", k.EntryBytes(), k.StoreBytes())
	}
	cacheList(errs, "cache.models", k.Models, nil)
	cacheList(errs, "cache.api_keys", k.APIKeys, nil)
	cacheList(errs, "cache.routes", k.Routes, CacheRoutes)
	if !k.Enabled() && (k.TTLSeconds != 0 || k.Scope != "" || k.MaxEntryBytes != 0 || len(k.Models)+len(k.APIKeys)+len(k.Routes) > 0) {
		errs.add("cache", "has settings but neither storage nor coalesce: set storage (memory or redis) or coalesce: true")
	}
}

func (c *Config) validateCacheRedis(errs *fieldErrors) {
	k := &c.Cache
	r := &k.Redis
	if k.Storage != CacheRedisStorage {
		if r.URL != "" || r.PasswordEnv != "" || r.TimeoutMillis != 0 {
			errs.add("cache.redis", "applies only to storage: redis")
		}
		return
	}
	if r.URL == "" {
		errs.add("cache.redis.url", "is required with storage: redis")
		return
	}
	t, err := ParseRedisURL(r.URL)
	if err != nil {
		errs.add("cache.redis.url", "%v", err)
		return
	}
	if r.TimeoutMillis < 0 || r.TimeoutMillis > 10000 {
		errs.add("cache.redis.timeout_ms", "must be from 1 to 10000, got %d", r.TimeoutMillis)
	}
	if c.RateLimiting.Storage != StorageRedis || c.RateLimiting.Redis.URL == "" {
		return
	}
	counters, err := ParseRedisURL(c.RateLimiting.Redis.URL)
	if err != nil {
		return // named by rate_limiting's own check
	}
	for _, a := range t.Addrs {
		if slices.Contains(counters.Addrs, a) {
			errs.add("cache.redis.url", "%s is the budget counters' Redis (rate_limiting.redis.url): the cache needs a Redis of its own, as the counters' must never evict and the cache's may", a)
			return
		}
	}
}

func cacheList(errs *fieldErrors, field string, list, allowed []string) {
	if len(list) > maxCacheListLen {
		errs.add(field, "must hold at most %d names, got %d", maxCacheListLen, len(list))
		return
	}
	seen := make(map[string]bool, len(list))
	for i, v := range list {
		f := fmt.Sprintf("%s[%d]", field, i)
		switch {
		case v == "":
			errs.add(f, "must not be empty")
		case seen[v]:
			errs.add(f, "%q is listed twice", v)
		case allowed != nil && !slices.Contains(allowed, v):
			errs.add(f, "must be one of %s, got %q", strings.Join(allowed, ", "), v)
		}
		seen[v] = true
	}
}

// cacheWarnings are the cache settings that do not do what they seem to.
func (c *Config) cacheWarnings() []string {
	k := &c.Cache
	var w []string
	for i, name := range k.APIKeys {
		if !slices.ContainsFunc(c.APIKeys, func(a APIKey) bool { return a.Name == name }) {
			w = append(w, fmt.Sprintf("cache.api_keys[%d]: no api key is named %q, so it selects nothing", i, name))
		}
	}
	if k.Enabled() && k.ScopeOrDefault() == CacheScopeTeam && !slices.ContainsFunc(c.APIKeys, func(a APIKey) bool { return a.Team != "" }) {
		w = append(w, "cache.scope: team, but no api key has a team, so nothing is cached")
	}
	if k.Enabled() && k.ScopeOrDefault() == CacheScopeAPIKey && c.Auth.Mode == AuthOptional {
		w = append(w, "cache.scope: api_key: anonymous requests have no key, so their answers are neither stored nor shared")
	}
	return w
}
