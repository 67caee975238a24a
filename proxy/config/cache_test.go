// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package config_test

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/tokenwarden/tokenwarden/proxy/config"
)

var _ = Describe("The cache", func() {
	It("is off unless configured: nothing stored, no request waits for another", func() {
		c, err := config.Parse([]byte(minimal))
		Expect(err).NotTo(HaveOccurred())
		Expect(c.Cache.Enabled()).To(BeFalse())
		Expect(c.Cache.Stores()).To(BeFalse())
		Expect(c.Cache.Coalesces()).To(BeFalse())
		out, err := c.Render()
		Expect(err).NotTo(HaveOccurred())
		Expect(string(out)).NotTo(ContainSubstring("cache"), "a document without a cache renders as before")
	})

	It("fills in a memory cache's defaults, and coalesces with it", func() {
		c, err := config.Parse([]byte(minimal + "cache: {storage: memory}\n"))
		Expect(err).NotTo(HaveOccurred())
		k := c.Cache
		Expect(k.Stores()).To(BeTrue())
		Expect(k.Coalesces()).To(BeTrue())
		Expect(k.StoreBytes()).To(Equal(int64(64 << 20)))
		Expect(k.EntryBytes()).To(Equal(int64(1 << 20)))
		Expect(k.TTL()).To(Equal(5 * time.Minute))
		Expect(k.ScopeOrDefault()).To(Equal(config.CacheScopeAPIKey), "answers are the key's own unless widened")
		Expect(k.Serves("/v1/chat/completions", "gpt-4o", "alice")).To(BeTrue(), "every charged route, model and key")
	})

	It("reads a Redis cache of its own, coalescing alone, and the lists that select what it serves", func() {
		c, err := config.Parse([]byte(minimal + `
rate_limiting: {storage: redis, redis: {url: "redis://counters:6379/0"}}
cache:
  storage: redis
  redis: {url: "redis://cache:6379/0", password_env: CACHE_PASSWORD, timeout_ms: 20}
  ttl_seconds: 60
  scope: team
  max_entry_bytes: 65536
  models: [gpt-4o]
  api_keys: [alice]
  routes: [/v1/chat/completions, /v1/messages]
  coalesce: false
`))
		Expect(err).NotTo(HaveOccurred())
		k := c.Cache
		Expect(k.Coalesces()).To(BeFalse())
		Expect(k.Redis.Timeout()).To(Equal(20 * time.Millisecond))
		Expect(k.TTL()).To(Equal(time.Minute))
		Expect(k.Serves("/v1/chat/completions", "gpt-4o", "alice")).To(BeTrue())
		Expect(k.Serves("/v1/responses", "gpt-4o", "alice")).To(BeFalse())
		Expect(k.Serves("/v1/messages", "claude", "alice")).To(BeFalse())
		Expect(k.Serves("/v1/messages", "gpt-4o", "bob")).To(BeFalse())

		alone, err := config.Parse([]byte(minimal + "cache: {coalesce: true}\n"))
		Expect(err).NotTo(HaveOccurred())
		Expect(alone.Cache.Stores()).To(BeFalse())
		Expect(alone.Cache.Coalesces()).To(BeTrue())
	})

	DescribeTable("refuses a cache that would not do what it says, naming the field",
		func(doc, want string) {
			_, err := config.Parse([]byte(minimal + doc))
			Expect(err).To(HaveOccurred())
			Expect(err.Error()).To(ContainSubstring(want))
		},
		Entry("an unknown storage", "cache: {storage: disk}\n", `cache.storage: must be "memory" or "redis", got "disk"`),
		Entry("a memory bound on a Redis cache", "cache: {storage: redis, redis: {url: 'redis://c:6379'}, memory_bytes: 2097152}\n", "cache.memory_bytes: applies only to storage: memory"),
		Entry("a memory store too small to hold an answer", "cache: {storage: memory, memory_bytes: 1000}\n", "cache.memory_bytes: must be at least 1048576 (1 MiB), got 1000"),
		Entry("a Redis cache without a URL", "cache: {storage: redis}\n", "cache.redis.url: is required with storage: redis"),
		Entry("a Redis URL that is not one", "cache: {storage: redis, redis: {url: 'http://c:6379'}}\n", `cache.redis.url: must be a redis://`),
		Entry("a Redis block on a memory cache", "cache: {storage: memory, redis: {url: 'redis://c:6379'}}\n", "cache.redis: applies only to storage: redis"),
		Entry("the budget counters' Redis, which must never evict",
			"rate_limiting: {storage: redis, redis: {url: 'redis://shared:6379/0'}}\ncache: {storage: redis, redis: {url: 'redis://shared:6379/3'}}\n",
			"cache.redis.url: shared:6379 is the budget counters' Redis (rate_limiting.redis.url): the cache needs a Redis of its own"),
		Entry("a negative time to live", "cache: {storage: memory, ttl_seconds: -1}\n", "cache.ttl_seconds: must be from 1 to 604800 (a week), got -1"),
		Entry("a time to live beyond a week", "cache: {storage: memory, ttl_seconds: 999999}\n", "cache.ttl_seconds"),
		Entry("an unknown scope", "cache: {storage: memory, scope: tenant}\n", `cache.scope: must be "api_key", "team" or "fleet", got "tenant"`),
		Entry("an entry larger than the store", "cache: {storage: memory, memory_bytes: 2097152, max_entry_bytes: 4194304}\n", "cache.max_entry_bytes: 4194304 is more than the store holds (memory_bytes 2097152)"),
		Entry("an entry beyond 64 MiB", "cache: {coalesce: true, max_entry_bytes: 134217728}\n", "cache.max_entry_bytes: must be from 1 to 67108864"),
		Entry("a route the proxy does not charge", "cache: {storage: memory, routes: [/v1/models]}\n", `cache.routes[0]: must be one of /v1/chat/completions`),
		Entry("a model listed twice", "cache: {storage: memory, models: [a, a]}\n", `cache.models[1]: "a" is listed twice`),
		Entry("an empty key name", "cache: {storage: memory, api_keys: ['']}\n", "cache.api_keys[0]: must not be empty"),
		Entry("settings with nothing on", "cache: {ttl_seconds: 60}\n", "cache: has settings but neither storage nor coalesce"),
		Entry("a typo", "cache: {storage: memory, ttl: 60}\n", "cache.ttl: unknown field"),
	)

	It("warns of a list naming no key, and of a team scope no key has", func() {
		c, err := config.Parse([]byte(minimal + "api_keys: [{name: alice, key_sha256: " + hash + "}]\ncache: {storage: memory, scope: team, api_keys: [alcie]}\n"))
		Expect(err).NotTo(HaveOccurred())
		Expect(c.Warnings()).To(ContainElements(
			`cache.api_keys[0]: no api key is named "alcie", so it selects nothing`,
			"cache.scope: team, but no api key has a team, so nothing is cached",
		))
	})
})
