// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package config_test

import (
	"strings"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/tokenwarden/tokenwarden/proxy/config"
)

func TestConfig(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "Proxy Config Suite")
}

const minimal = `
upstreams:
- {name: default, url: "http://127.0.0.1:8000"}
`

const hash = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"

var _ = Describe("Parse", func() {
	It("fills in the defaults of a minimal document", func() {
		c, err := config.Parse([]byte(minimal))
		Expect(err).NotTo(HaveOccurred())
		Expect(c.Listen).To(Equal("127.0.0.1:8080"))
		Expect(c.AdminListen).To(Equal("127.0.0.1:9090"))
		Expect(c.MaxBodyBytes).To(Equal(int64(16 << 20)))
		Expect(c.Auth.Mode).To(Equal(config.AuthRequired))
		Expect(c.RateLimiting.Storage).To(Equal(config.StorageMemory))
		Expect(c.RateLimiting.MaxBuckets).To(Equal(int64(100000)))
		Expect(*c.RateLimiting.Redis.FallbackToMemory).To(BeTrue())
		Expect(c.RateLimiting.Redis.Checks).To(Equal(config.RedisChecks{Mode: config.ChecksReport, IntervalSeconds: 60}), "the store checks report, every minute")
		Expect(c.RateLimiting.Overage).To(Equal(config.OverageDebt), "an uncovered overage goes into debt unless forgiven")
		Expect(c.RateLimiting.ClientIPv6Prefix).To(Equal(64))
		Expect(c.RetryPatience()).To(Equal(time.Minute), "the longest Retry-After an SDK is expected to sleep through")
		Expect(c.Divisor()).To(Equal(int64(1)))
	})

	It("round-trips through Marshal", func() {
		c, err := config.Parse([]byte(minimal + `
api_keys: [{name: a, key_sha256: ` + hash + `, user: u, rate_limit_tokens_per_minute: 5}]
rate_limiting:
  budget_division: {replicas: 3}
  limits:
    per_model: {gpt-4o: {tokens_per_minute: 10, tokens_per_day: 20}}
`))
		Expect(err).NotTo(HaveOccurred())
		out, err := c.Marshal()
		Expect(err).NotTo(HaveOccurred())
		again, err := config.Parse(out)
		Expect(err).NotTo(HaveOccurred())
		Expect(again).To(Equal(c))
	})

	DescribeTable("refuses a bad document with a message naming the field",
		func(doc, message string) {
			_, err := config.Parse([]byte(doc))
			Expect(err).To(HaveOccurred())
			Expect(err.Error()).To(ContainSubstring(message))
		},
		Entry("an empty document", "", "the document is empty"),
		Entry("a typo in a limit", minimal+"rate_limiting: {limits: {global: {tokens_per_minit: 5}}}",
			"rate_limiting.limits.global.tokens_per_minit: unknown field"),
		Entry("a typo inside a per_model entry", minimal+"rate_limiting: {limits: {per_model: {m: {tpm: 5}}}}",
			`rate_limiting.limits.per_model["m"].tpm: unknown field`),
		Entry("a typo in a key", minimal+"api_keys: [{name: a, key_sha256: "+hash+", usr: x}]", "api_keys[0].usr: unknown field"),
		Entry("no upstream", "listen: 127.0.0.1:1", "upstreams: at least one upstream is required"),
		Entry("an upstream URL without a scheme", "upstreams: [{name: a, url: 127.0.0.1:8000}]", "upstreams[0].url: must be an http:// or https:// URL"),
		Entry("two upstreams with one name", "upstreams: [{name: a, url: 'http://x'}, {name: a, url: 'http://y'}]", `upstreams[1].name: "a" is also the name of upstreams[0]`),
		Entry("a model served twice", "upstreams: [{name: a, url: 'http://x', models: [m]}, {name: b, url: 'http://y', models: [m]}]", `upstreams[1].models[0]: model "m" is also listed by upstreams[0]`),
		Entry("a bad listen address", minimal+"listen: localhost", `listen: must be host:port, got "localhost"`),
		Entry("an unknown auth mode", minimal+"auth: {mode: sometimes}", `auth.mode: must be "required" or "optional", got "sometimes"`),
		Entry("a bad trusted proxy", minimal+"auth: {trusted_proxies: [10.0.0.0/33]}", "auth.trusted_proxies[0]: not a CIDR"),
		Entry("a key hash that is not SHA-256", minimal+"api_keys: [{name: a, key_sha256: abc}]", "api_keys[0].key_sha256: must be the 64 hex digits"),
		Entry("two keys with one hash", minimal+"api_keys: [{name: a, key_sha256: "+hash+"}, {name: b, key_sha256: "+strings.ToUpper(hash)+"}]", "api_keys[1].key_sha256: the same key as api_keys[0]"),
		Entry("a negative override", minimal+"api_keys: [{name: a, key_sha256: "+hash+", rate_limit_tokens_per_minute: -1}]", "api_keys[0].rate_limit_tokens_per_minute: must not be negative"),
		Entry("a negative budget", minimal+"rate_limiting: {limits: {per_team: {tokens_per_day: -1}}}", "rate_limiting.limits.per_team.tokens_per_day: must not be negative"),
		Entry("an unknown storage", minimal+"rate_limiting: {storage: etcd}", `rate_limiting.storage: must be "memory" or "redis", got "etcd"`),
		Entry("redis storage without a URL", minimal+"rate_limiting: {storage: redis}", "rate_limiting.redis.url: is required when rate_limiting.storage is redis"),
		Entry("a Sentinel URL in another scheme", minimal+"rate_limiting: {storage: redis, redis: {url: 'redis-sentinel://h:26379'}}", "rate_limiting.redis.url: a Sentinel URL is redis+sentinel://"),
		Entry("a Sentinel URL without a master", minimal+"rate_limiting: {storage: redis, redis: {url: 'redis+sentinel://h:26379'}}", "rate_limiting.redis.url: a Sentinel URL names the master after the addresses"),
		Entry("a sentinel password without Sentinel", minimal+"rate_limiting: {storage: redis, redis: {url: 'redis://h:6379', sentinel_password_env: P}}", "rate_limiting.redis.sentinel_password_env: only a redis+sentinel:// url has sentinels"),
		Entry("a hot budget slice above half", minimal+"rate_limiting: {storage: redis, redis: {url: 'redis://h:6379', hot_budget_slice: 0.75}}", "rate_limiting.redis.hot_budget_slice: must be a fraction of a budget from 0 to 0.5, got 0.75"),
		Entry("an unknown store-check mode", minimal+"rate_limiting: {storage: redis, redis: {url: 'redis://h:6379', checks: {mode: fence}}}", `rate_limiting.redis.checks.mode: must be "report" or "enforce", got "fence"`),
		Entry("a negative store-check interval", minimal+"rate_limiting: {storage: redis, redis: {url: 'redis://h:6379', checks: {interval_seconds: -1}}}", "rate_limiting.redis.checks.interval_seconds: must not be negative"),
		Entry("a Cluster URL with a database", minimal+"rate_limiting: {storage: redis, redis: {url: 'redis+cluster://a:6379,b:6379/2'}}", "rate_limiting.redis.url: a Redis Cluster has only database 0"),
		Entry("an epoch not in the reported form", minimal+"rate_limiting: {storage: redis, redis: {url: 'redis://h:6379', epoch: yesterday}}", `rate_limiting.redis.epoch: want <created Unix milliseconds>-<hex digits>, as the replicas report it, got "yesterday"`),
		Entry("a Cluster URL", minimal+"rate_limiting: {storage: redis, redis: {url: 'redis://a:6379,b:6379'}}", "rate_limiting.redis.url: several addresses name a Redis Cluster: write redis+cluster://a:6379,b:6379"),
		Entry("a negative division", minimal+"rate_limiting: {budget_division: {replicas: -2}}", "rate_limiting.budget_division.replicas: must not be negative"),
		Entry("a bad whitelist entry", minimal+"rate_limiting: {whitelist: [nope]}", `rate_limiting.whitelist[0]: not an address or CIDR: "nope"`),
		Entry("an unknown overage rule", minimal+"rate_limiting: {overage: refund}", `rate_limiting.overage: must be "debt" or "forgive", got "refund"`),
		Entry("an IPv6 prefix longer than an address", minimal+"rate_limiting: {client_ipv6_prefix: 129}", "rate_limiting.client_ipv6_prefix: must be a prefix length from 1 to 128, got 129"),
		Entry("a negative IPv6 prefix", minimal+"rate_limiting: {client_ipv6_prefix: -1}", "rate_limiting.client_ipv6_prefix: must be a prefix length from 1 to 128, got -1"),
		Entry("a negative retry patience", minimal+"rate_limiting: {retry_patience_seconds: -5}", "rate_limiting.retry_patience_seconds: must be a number of seconds above 0, got -5"),
	)

	DescribeTable("accepts every documented value of the second round's fields",
		func(doc string, check func(*config.Config)) {
			c, err := config.Parse([]byte(minimal + doc))
			Expect(err).NotTo(HaveOccurred())
			check(c)
		},
		Entry("overage: forgive consumes nothing from a bucket that cannot cover the overage", "rate_limiting: {overage: forgive}",
			func(c *config.Config) { Expect(c.RateLimiting.Overage).To(Equal(config.OverageForgive)) }),
		Entry("overage: debt", "rate_limiting: {overage: debt}",
			func(c *config.Config) { Expect(c.RateLimiting.Overage).To(Equal(config.OverageDebt)) }),
		Entry("every IPv6 client its own identity", "rate_limiting: {client_ipv6_prefix: 128}",
			func(c *config.Config) { Expect(c.RateLimiting.ClientIPv6Prefix).To(Equal(128)) }),
		Entry("the shortest prefix", "rate_limiting: {client_ipv6_prefix: 1}",
			func(c *config.Config) { Expect(c.RateLimiting.ClientIPv6Prefix).To(Equal(1)) }),
		Entry("a retry patience of ten minutes", "rate_limiting: {retry_patience_seconds: 600}",
			func(c *config.Config) { Expect(c.RetryPatience()).To(Equal(10 * time.Minute)) }),
		Entry("a retry patience of 0 keeps the default", "rate_limiting: {retry_patience_seconds: 0}",
			func(c *config.Config) { Expect(c.RetryPatience()).To(Equal(time.Minute)) }),
	)

	It("reports every invalid field at once", func() {
		_, err := config.Parse([]byte("upstreams: [{name: '', url: x}]\nauth: {mode: x}"))
		Expect(err).To(HaveOccurred())
		Expect(err.Error()).To(SatisfyAll(ContainSubstring("upstreams[0].name"), ContainSubstring("upstreams[0].url"), ContainSubstring("auth.mode")))
	})
})

var _ = Describe("Warnings", func() {
	warnings := func(doc string) []string {
		c, err := config.Parse([]byte(doc))
		Expect(err).NotTo(HaveOccurred())
		return c.Warnings()
	}

	It("has none for a sound document", func() {
		Expect(warnings(minimal + `
api_keys: [{name: a, key_sha256: ` + hash + `, user: u, team: t}]
rate_limiting:
  budget_division: {replicas: 2}
  limits:
    per_api_key: {tokens_per_minute: 100}
    per_user: {tokens_per_minute: 100}
    per_team: {tokens_per_minute: 100}
`)).To(BeEmpty())
	})

	DescribeTable("warns where a budget would behave other than meant",
		func(doc, warning string) {
			if !strings.Contains(doc, "upstreams:") {
				doc = minimal + doc
			}
			Expect(warnings(doc)).To(ContainElement(ContainSubstring(warning)))
		},
		Entry("an in-memory token budget with no division", "rate_limiting: {limits: {global: {tokens_per_minute: 5}}}",
			"in-memory token budgets with no budget_division"),
		Entry("a division while storage is redis", "rate_limiting: {storage: redis, redis: {url: 'redis://h:6379'}, budget_division: {replicas: 3}}",
			"is set while storage is redis"),
		Entry("a budget divided down to nothing", "rate_limiting: {budget_division: {replicas: 10}, limits: {global: {tokens_per_day: 9}}}",
			"rate_limiting.limits.global.tokens_per_day: 9 divided among 10 replicas is 0 per replica"),
		Entry("a per_model budget for a model no upstream serves",
			"rate_limiting: {budget_division: {replicas: 1}, limits: {per_model: {ghost: {tokens_per_minute: 5}}}}\nupstreams: [{name: d, url: 'http://x', models: [real]}]",
			`per_model["ghost"]: no upstream serves this model`),
		Entry("a per_team budget while no key has a team",
			"api_keys: [{name: a, key_sha256: "+hash+"}]\nrate_limiting: {budget_division: {replicas: 1}, limits: {per_team: {tokens_per_minute: 5}}}",
			"rate_limiting.limits.per_team: no api key has a team"),
		Entry("overrides on a bypass key", "api_keys: [{name: a, key_sha256: "+hash+", bypass: true, rate_limit: 5}]",
			"bypass exempts the key from every limit"),
		Entry("a burst with no rate", "rate_limiting: {limits: {global: {burst_capacity: 5}}}",
			"burst_capacity: has no effect without requests_per_second"),
		Entry("an in-memory rule with no division", "rate_limiting: {rules: [{name: r, dimension: global, windows: [{limit: 5, rolling: {period: minute}}]}]}",
			"in-memory token budgets with no budget_division"),
		Entry("a rule's rolling window divided down to nothing",
			"rate_limiting: {budget_division: {replicas: 10}, rules: [{name: r, dimension: global, amount: requests, windows: [{limit: 9, rolling: {period: second}}]}]}",
			"rate_limiting.rules[0].windows[0].limit: 9 divided among 10 replicas is 0 per replica"),
	)
})

var _ = Describe("RestartRequired", func() {
	parse := func(doc string) *config.Config {
		c, err := config.Parse([]byte(minimal + doc))
		Expect(err).NotTo(HaveOccurred())
		return c
	}
	const redis = "rate_limiting: {storage: redis, redis: {url: 'redis://a:6379/0'}}\n"

	DescribeTable("names each changed field that only a restart applies",
		func(started, next string, fields []string) {
			Expect(config.RestartRequired(parse(started), parse(next))).To(Equal(fields))
			// What a process keeps of the document it started with tells the same.
			basis := config.RestartBasis(parse(started))
			Expect(basis.APIKeys).To(BeNil())
			Expect(config.RestartRequired(basis, parse(next))).To(Equal(fields))
		},
		Entry("nothing changed", redis, redis, []string{}),
		Entry("the listen addresses", "", "listen: 127.0.0.1:1\nadmin_listen: 127.0.0.1:2\n", []string{"listen", "admin_listen"}),
		Entry("the storage", "", redis, []string{"rate_limiting.storage", "rate_limiting.redis.url"}),
		Entry("the Redis URL", redis, "rate_limiting: {storage: redis, redis: {url: 'redis://b:6379/0'}}\n", []string{"rate_limiting.redis.url"}),
		Entry("how the store reaches Redis", redis,
			"rate_limiting: {storage: redis, redis: {url: 'redis://a:6379/0', password_env: P, key_prefix: k, dial_timeout_ms: 1, read_timeout_ms: 2, write_timeout_ms: 3}}\n",
			[]string{"rate_limiting.redis.password_env", "rate_limiting.redis.key_prefix", "rate_limiting.redis.dial_timeout_ms",
				"rate_limiting.redis.read_timeout_ms", "rate_limiting.redis.write_timeout_ms"}),
		Entry("redis settings while no document uses Redis", "", "rate_limiting: {redis: {url: 'redis://b:6379/0'}}\n", []string{}),
		Entry("what a reload applies at once", redis,
			"rate_limiting: {storage: redis, redis: {url: 'redis://a:6379/0', fallback_to_memory: false}, max_buckets: 5, overage: forgive, client_ipv6_prefix: 56, budget_division: {replicas: 3}}\nmax_body_bytes: 10\n",
			[]string{}),
		Entry("the store checks, which a reload applies at once", redis,
			"rate_limiting: {storage: redis, redis: {url: 'redis://a:6379/0', checks: {mode: enforce, interval_seconds: 5, username: checker, password_env: C}}}\n",
			[]string{}),
	)
})

var _ = DescribeTable("DrainTimeout: how long a stopping proxy waits for what is in flight",
	func(timeouts []int64, want time.Duration) { Expect(config.DrainTimeout(timeouts...)).To(Equal(want)) },
	Entry("no upstream: the default upstream timeout", nil, 300*time.Second),
	Entry("an unset timeout counts as the default", []int64{0, 60}, 300*time.Second),
	Entry("the largest upstream timeout", []int64{30, 120, 90}, 120*time.Second),
	Entry("at most ten minutes", []int64{3600}, 10*time.Minute),
)
