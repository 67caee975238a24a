// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package controllers_test

import (
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	twv1alpha1 "github.com/tokenwarden/tokenwarden/api/v1alpha1"
	"github.com/tokenwarden/tokenwarden/proxy/config"
)

// sentinelEnv is the proxy's environment variable with the sentinels' password.
const sentinelEnv = "TOKENWARDEN_REDIS_SENTINEL_PASSWORD"

var _ = Describe("A fleet on a Sentinel primary", func() {
	It("renders the sentinels' URL, the hot budget slice and the ledger fallback, and passes both passwords from their Secrets", func() {
		ns := newNamespace("sentinel")
		tp := fleetProxy(ns, 2)
		tp.Spec.Storage = twv1alpha1.StorageSpec{Type: twv1alpha1.StorageRedis, Redis: &twv1alpha1.RedisSpec{
			URL:                       "redis+sentinel://s-0.sentinel:26379,s-1.sentinel:26379/primary",
			PasswordSecretRef:         &twv1alpha1.SecretKeyReference{Name: "redis-auth", Key: "password"},
			SentinelPasswordSecretRef: &twv1alpha1.SecretKeyReference{Name: "redis-auth", Key: "sentinel"},
			HotBudgetSlicePercent:     ptr.To(int32(2)),
			LedgerFallback:            &twv1alpha1.RedisLedgerFallback{MaxConcurrent: ptr.To(int32(8))},
		}}
		for _, o := range []client.Object{
			credentialSecret(ns, "provider", map[string]string{"anthropic": "upstream"}),
			credentialSecret(ns, "redis-auth", map[string]string{"password": "p", "sentinel": "s"}),
			tp,
		} {
			Expect(k8sClient.Create(ctx, o)).To(Succeed())
		}
		Eventually(func(g Gomega) {
			c := rendered(g, ns)
			g.Expect(c.RateLimiting.Storage).To(Equal(config.StorageRedis))
			g.Expect(c.RateLimiting.Redis.URL).To(Equal("redis+sentinel://s-0.sentinel:26379,s-1.sentinel:26379/primary"))
			g.Expect(c.RateLimiting.Redis.PasswordEnv).To(Equal("TOKENWARDEN_REDIS_PASSWORD"))
			g.Expect(c.RateLimiting.Redis.SentinelPasswordEnv).To(Equal(sentinelEnv))
			g.Expect(c.RateLimiting.Redis.HotBudgetSlice).To(Equal(0.02))
			g.Expect(c.RateLimiting.Redis.LedgerFallback).To(Equal(&config.LedgerFallback{MaxConcurrent: 8}))
			env := map[string]*corev1.EnvVarSource{}
			for _, e := range deployment(g, ns).Spec.Template.Spec.Containers[0].Env {
				env[e.Name] = e.ValueFrom
			}
			g.Expect(env).To(HaveKey(sentinelEnv))
			g.Expect(env[sentinelEnv].SecretKeyRef.Name).To(Equal("redis-auth"))
			g.Expect(env[sentinelEnv].SecretKeyRef.Key).To(Equal("sentinel"))
		}).Should(Succeed())
	})

	It("says the ledger fallback is off, naming spec.storage.redis.ledgerFallback, on a fleet without a PostgreSQL ledger, and on once it has one", func() {
		ns := newNamespace("fallback")
		tp := redisFleet(ns, 2)
		tp.Spec.Storage.Redis.LedgerFallback = &twv1alpha1.RedisLedgerFallback{}
		for _, o := range []client.Object{
			credentialSecret(ns, "provider", map[string]string{"anthropic": "upstream"}),
			credentialSecret(ns, "ledger-db", map[string]string{"url": "postgres://tw:pw@pg:5432/ledger"}),
			tp,
		} {
			Expect(k8sClient.Create(ctx, o)).To(Succeed())
		}
		fallback := func(g Gomega) verdict {
			return verdictOf(proxyStatus(g, ns).Conditions, twv1alpha1.ConditionLedgerFallback)
		}
		Eventually(fallback).Should(Equal(verdict{"False", twv1alpha1.ReasonNoLedger,
			"spec.storage.redis.ledgerFallback is off: it needs the fleet's PostgreSQL spend ledger (spec.ledger.urlSecretRef, " +
				"or the operator's default ledger, and spec.ledger.disabled unset), and the fleet has none; every calendar " +
				"and cost budget fails closed while Redis is unreachable"}))

		By("a ledger: the fallback is on")
		Eventually(func() error {
			var cur twv1alpha1.TokenProxy
			if err := k8sClient.Get(ctx, client.ObjectKeyFromObject(tp), &cur); err != nil {
				return err
			}
			cur.Spec.Ledger = &twv1alpha1.LedgerSpec{URLSecretRef: &twv1alpha1.SecretKeyReference{Name: "ledger-db", Key: "url"}}
			return k8sClient.Update(ctx, &cur)
		}).Should(Succeed())
		Eventually(fallback).Should(HaveField("Reason", twv1alpha1.ReasonLedgerFallbackOn))
		Expect(fallback(Default).Status).To(Equal(metav1.ConditionTrue))
	})
})
