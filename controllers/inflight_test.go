// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package controllers_test

import (
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	"sigs.k8s.io/controller-runtime/pkg/client"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	twv1alpha1 "github.com/tokenwarden/tokenwarden/api/v1alpha1"
	"github.com/tokenwarden/tokenwarden/proxy/attribute"
	"github.com/tokenwarden/tokenwarden/proxy/config"
	"github.com/tokenwarden/tokenwarden/test/fakellm"
)

var _ = Describe("An InFlight TokenBudget from TokenBudget to proxy", func() {
	It("holds each session of a key to its requests in flight, and says in Ready that each replica keeps its own", func() {
		backend := fakellm.New()
		url, ns, _ := attributeFleetOn(backend, func(ns, _ string) []*twv1alpha1.TokenBudget {
			return []*twv1alpha1.TokenBudget{ruleBudget(ns, "one-per-session", twv1alpha1.DimensionPerAPIKey, func(s *twv1alpha1.TokenBudgetSpec) {
				s.Amount, s.CountBy = twv1alpha1.AmountInFlight, twv1alpha1.CountBySession
				s.Windows = windows(twv1alpha1.BudgetWindow{Limit: resource.MustParse("1")})
			})}
		})
		r := rulesOf(Default, ns)[0]
		Expect(r.Amount).To(Equal(config.AmountInFlight))
		Expect(r.CountBy).To(Equal(config.RuleSession))
		Expect(r.Windows).To(Equal([]config.Window{{Limit: 1}}))

		// One request of session s-1 waits for its answer while the others are sent.
		slow := aliceChat(attribute.SessionHeader, "s-1", fakellm.HeaderBehaviour, `{"Latency":3000000000}`)
		done := make(chan int, 1)
		go func() {
			defer GinkgoRecover()
			done <- slow(url)
		}()
		Eventually(func() int { return len(backend.Requests()) }).Should(Equal(1), "the first reaches the backend")
		Expect(aliceChat(attribute.SessionHeader, "s-1")(url)).To(Equal(429), "a second request of s-1 while the first is in flight")
		Expect(aliceChat(attribute.SessionHeader, "s-2")(url)).To(Equal(200), "another session is its own")
		Expect(<-done).To(Equal(200))
		Expect(aliceChat(attribute.SessionHeader, "s-1")(url)).To(Equal(200), "the first ended: its slot is back")

		Eventually(func(g Gomega) {
			var b twv1alpha1.TokenBudget
			g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: "one-per-session"}, &b)).To(Succeed())
			ready := meta.FindStatusCondition(b.Status.Conditions, twv1alpha1.ConditionReady)
			g.Expect(ready).NotTo(BeNil())
			g.Expect(ready.Message).To(ContainSubstring("memory storage: each replica's own limit in flight, whole, not divided"))
			g.Expect(b.Status.Summary.Windows).To(Equal("1 in flight"))
		}).Should(Succeed())

		By("the fleet moving to Redis storage")
		var tp twv1alpha1.TokenProxy
		Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: "fleet"}, &tp)).To(Succeed())
		patch := client.MergeFrom(tp.DeepCopy())
		tp.Spec.Storage = twv1alpha1.StorageSpec{Type: twv1alpha1.StorageRedis, Redis: &twv1alpha1.RedisSpec{URL: "redis://redis:6379"}}
		Expect(k8sClient.Patch(ctx, &tp, patch)).To(Succeed())
		Eventually(func(g Gomega) {
			var b twv1alpha1.TokenBudget
			g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: "one-per-session"}, &b)).To(Succeed())
			ready := meta.FindStatusCondition(b.Status.Conditions, twv1alpha1.ConditionReady)
			g.Expect(ready).NotTo(BeNil())
			g.Expect(ready.Message).To(ContainSubstring("Redis storage: the replicas share the fleet's total in flight, in leased slots (a replica that dies frees its slots within 30s)"))
			g.Expect(ready.Message).NotTo(ContainSubstring("each replica's own"))
			g.Expect(b.Status.Summary.Windows).To(Equal("1 in flight"))
		}).Should(Succeed())
	})
})
