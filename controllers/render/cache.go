// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package render

import (
	twv1alpha1 "github.com/tokenwarden/tokenwarden/api/v1alpha1"
	"github.com/tokenwarden/tokenwarden/proxy/config"
)

// CacheRedisPasswordEnv is the proxy's environment variable with the cache Redis'
// password.
const CacheRedisPasswordEnv = "TOKENWARDEN_CACHE_REDIS_PASSWORD"

var cacheScopes = map[twv1alpha1.CacheScope]string{
	twv1alpha1.CacheScopeAPIKey: config.CacheScopeAPIKey,
	twv1alpha1.CacheScopeTeam:   config.CacheScopeTeam,
	twv1alpha1.CacheScopeFleet:  config.CacheScopeFleet,
}

// Cache renders spec.cache into the document's cache block; an unset spec leaves
// the block out, so the document does not change.
func Cache(c *config.Config, s *twv1alpha1.CacheSpec) {
	if s == nil {
		return
	}
	out := config.Cache{
		TTLSeconds: s.TTLSeconds, Scope: cacheScopes[s.Scope], Coalesce: s.Coalesce,
		Models: s.Models, APIKeys: s.APIKeys,
	}
	for _, r := range s.Routes {
		out.Routes = append(out.Routes, string(r))
	}
	if s.MaxEntrySize != nil {
		out.MaxEntryBytes = s.MaxEntrySize.Value()
	}
	switch s.Storage {
	case twv1alpha1.StorageMemory:
		out.Storage = config.CacheMemoryStorage
		if s.MemorySize != nil {
			out.MemoryBytes = s.MemorySize.Value()
		}
	case twv1alpha1.StorageRedis:
		out.Storage = config.CacheRedisStorage
		if r := s.Redis; r != nil {
			out.Redis = config.CacheRedis{URL: r.URL, TimeoutMillis: r.TimeoutMillis}
			if r.PasswordSecretRef != nil {
				out.Redis.PasswordEnv = CacheRedisPasswordEnv
			}
		}
	}
	c.Cache = out
}
