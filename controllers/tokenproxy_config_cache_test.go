// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package controllers_test

import (
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"

	twv1alpha1 "github.com/tokenwarden/tokenwarden/api/v1alpha1"
	"github.com/tokenwarden/tokenwarden/proxy/config"
)

var _ = Describe("The fleet's response cache, as the TokenProxy sets it", func() {
	It("leaves the cache out of the proxies' document unless the TokenProxy sets one", func() {
		ns := newNamespace("cache-off")
		Expect(k8sClient.Create(ctx, fleetProxy(ns, 1))).To(Succeed())
		Eventually(func(g Gomega) {
			g.Expect(rendered(g, ns).Cache).To(Equal(config.Cache{}))
		}).Should(Succeed())
	})

	It("renders a memory cache, its scope, bounds and lists", func() {
		ns := newNamespace("cache-memory")
		tp := fleetProxy(ns, 1)
		tp.Spec.Cache = &twv1alpha1.CacheSpec{
			Storage: twv1alpha1.StorageMemory, MemorySize: ptr.To(resource.MustParse("128Mi")),
			TTLSeconds: 60, Scope: twv1alpha1.CacheScopeTeam, MaxEntrySize: ptr.To(resource.MustParse("256Ki")),
			Models: []string{"gpt-4o"}, Routes: []twv1alpha1.CacheRoute{"/v1/chat/completions"},
		}
		Expect(k8sClient.Create(ctx, tp)).To(Succeed())
		Eventually(func(g Gomega) {
			c := rendered(g, ns).Cache
			g.Expect(c).To(Equal(config.Cache{
				Storage: config.CacheMemoryStorage, MemoryBytes: 128 << 20, TTLSeconds: 60, Scope: config.CacheScopeTeam,
				MaxEntryBytes: 256 << 10, Models: []string{"gpt-4o"}, Routes: []string{"/v1/chat/completions"},
			}))
			g.Expect(c.Coalesces()).To(BeTrue())
		}).Should(Succeed())
	})

	It("renders a Redis cache of its own, with its password from a Secret into the pods' environment", func() {
		ns := newNamespace("cache-redis")
		tp := fleetProxy(ns, 1)
		tp.Spec.Cache = &twv1alpha1.CacheSpec{
			Storage: twv1alpha1.StorageRedis, Coalesce: ptr.To(false),
			Redis: &twv1alpha1.CacheRedisSpec{URL: "redis://cache:6379/0", TimeoutMillis: 20,
				PasswordSecretRef: &twv1alpha1.SecretKeyReference{Name: "cache-redis", Key: "password"}},
		}
		Expect(k8sClient.Create(ctx, credentialSecret(ns, "cache-redis", map[string]string{"password": "p"}))).To(Succeed())
		Expect(k8sClient.Create(ctx, tp)).To(Succeed())
		Eventually(func(g Gomega) {
			c := rendered(g, ns).Cache
			g.Expect(c.Storage).To(Equal(config.CacheRedisStorage))
			g.Expect(c.Redis).To(Equal(config.CacheRedis{URL: "redis://cache:6379/0", PasswordEnv: "TOKENWARDEN_CACHE_REDIS_PASSWORD", TimeoutMillis: 20}))
			g.Expect(c.Coalesces()).To(BeFalse())
			env := deployment(g, ns).Spec.Template.Spec.Containers[0].Env
			g.Expect(env).To(ContainElement(And(
				HaveField("Name", "TOKENWARDEN_CACHE_REDIS_PASSWORD"),
				HaveField("ValueFrom.SecretKeyRef.Name", "cache-redis"),
				HaveField("ValueFrom.SecretKeyRef.Key", "password"),
			)))
		}).Should(Succeed())
	})

	DescribeTable("refuses a bad cache with the API server's message",
		func(mutate func(*twv1alpha1.TokenProxySpec), message string) {
			tp := fleetProxy(newNamespace("cache-bad"), 1)
			mutate(&tp.Spec)
			err := k8sClient.Create(ctx, tp)
			Expect(err).To(HaveOccurred())
			Expect(err.Error()).To(ContainSubstring(message))
		},
		Entry("a Redis cache without its Redis",
			func(s *twv1alpha1.TokenProxySpec) { s.Cache = &twv1alpha1.CacheSpec{Storage: twv1alpha1.StorageRedis} },
			"spec.cache: Invalid value: redis is required when storage is Redis and must not be set otherwise"),
		Entry("a Redis block on a memory cache",
			func(s *twv1alpha1.TokenProxySpec) {
				s.Cache = &twv1alpha1.CacheSpec{Storage: twv1alpha1.StorageMemory, Redis: &twv1alpha1.CacheRedisSpec{URL: "redis://c:6379"}}
			},
			"redis is required when storage is Redis and must not be set otherwise"),
		Entry("a memory size on a Redis cache",
			func(s *twv1alpha1.TokenProxySpec) {
				s.Cache = &twv1alpha1.CacheSpec{Storage: twv1alpha1.StorageRedis, MemorySize: ptr.To(resource.MustParse("64Mi")),
					Redis: &twv1alpha1.CacheRedisSpec{URL: "redis://c:6379"}}
			},
			"memorySize applies only to storage Memory"),
		Entry("a memory store below 1Mi",
			func(s *twv1alpha1.TokenProxySpec) {
				s.Cache = &twv1alpha1.CacheSpec{Storage: twv1alpha1.StorageMemory, MemorySize: ptr.To(resource.MustParse("100Ki"))}
			},
			"spec.cache.memorySize: Invalid value: \"100Ki\": memorySize must be at least 1Mi"),
		Entry("an entry beyond 64Mi",
			func(s *twv1alpha1.TokenProxySpec) {
				s.Cache = &twv1alpha1.CacheSpec{Coalesce: ptr.To(true), MaxEntrySize: ptr.To(resource.MustParse("1Gi"))}
			},
			"maxEntrySize must be from 1 to 64Mi"),
		Entry("an unknown scope",
			func(s *twv1alpha1.TokenProxySpec) {
				s.Cache = &twv1alpha1.CacheSpec{Storage: twv1alpha1.StorageMemory, Scope: "Tenant"}
			},
			`spec.cache.scope: Unsupported value: "Tenant": supported values: "APIKey", "Team", "Fleet"`),
		Entry("a route the proxy does not charge",
			func(s *twv1alpha1.TokenProxySpec) {
				s.Cache = &twv1alpha1.CacheSpec{Storage: twv1alpha1.StorageMemory, Routes: []twv1alpha1.CacheRoute{"/v1/models"}}
			},
			`spec.cache.routes[0]: Unsupported value: "/v1/models"`),
		Entry("a time to live beyond a week",
			func(s *twv1alpha1.TokenProxySpec) {
				s.Cache = &twv1alpha1.CacheSpec{Storage: twv1alpha1.StorageMemory, TTLSeconds: 700000}
			},
			"spec.cache.ttlSeconds: Invalid value: 700000: spec.cache.ttlSeconds in body should be less than or equal to 604800"),
		Entry("the budget counters' Redis as the cache's",
			func(s *twv1alpha1.TokenProxySpec) {
				s.Storage = twv1alpha1.StorageSpec{Type: twv1alpha1.StorageRedis, Redis: &twv1alpha1.RedisSpec{URL: "redis://shared:6379/0"}}
				s.Cache = &twv1alpha1.CacheSpec{Storage: twv1alpha1.StorageRedis, Redis: &twv1alpha1.CacheRedisSpec{URL: "redis://shared:6379/0"}}
			},
			"cache.redis.url must name a Redis of the cache's own, not spec.storage.redis.url: the counters' Redis must never evict"),
	)
})
