// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package controllers_test

import (
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	twv1alpha1 "github.com/tokenwarden/tokenwarden/api/v1alpha1"
	"github.com/tokenwarden/tokenwarden/proxy/config"
)

var _ = Describe("The model registry of a TokenProxy", func() {
	It("renders each model's window, largest output and ordered upstreams, and refuses one naming no upstream of the fleet", func() {
		ns := newNamespace("registry")
		Expect(k8sClient.Create(ctx, credentialSecret(ns, "provider", map[string]string{"anthropic": "upstream"}))).To(Succeed())
		tp := fleetProxy(ns, 1)
		tp.Spec.Upstreams[0].Provider = twv1alpha1.ProviderAnthropic
		tp.Spec.Upstreams = append(tp.Spec.Upstreams, twv1alpha1.Upstream{Name: "azure", URL: "https://azure.internal", Provider: twv1alpha1.ProviderOpenAI})
		tp.Spec.Models = []twv1alpha1.ModelSpec{{Name: "gpt-4o", ContextWindow: 128000, MaxOutputTokens: 16384, Tokenizer: "o200k_base",
			Upstreams: []twv1alpha1.ModelUpstream{{Upstream: "azure", ProviderModel: "gpt-4o-2024-08-06"}, {Upstream: "nowhere"}}}}
		Expect(k8sClient.Create(ctx, tp)).To(Succeed())
		Eventually(func(g Gomega) {
			acc := condition(proxyStatus(g, ns).Conditions, twv1alpha1.ConditionAccepted)
			g.Expect(acc.Status).To(Equal(metav1.ConditionFalse))
			g.Expect(acc.Message).To(ContainSubstring(`models[0].upstreams[1].upstream: no entry of upstreams is named "nowhere"`))
		}).Should(Succeed())

		Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(tp), tp)).To(Succeed())
		patch := client.MergeFrom(tp.DeepCopy())
		tp.Spec.Models[0].Upstreams[1].Upstream = "vllm"
		tp.Spec.Models[0].Upstreams[1].Tokenizer = "cl100k_base"
		tp.Spec.Models[0].AdmissionPolicy, tp.Spec.Models[0].AcceptsLoweredOutputCap = twv1alpha1.AdmissionClamp, true
		tp.Spec.Routing.AdmissionPolicy = twv1alpha1.AdmissionRefuse
		tp.Spec.Routing.BillingCooldownSeconds = 1800
		tp.Spec.Models[0].UnavailableFallback = "gpt-4o-mini"
		tp.Spec.Models = append(tp.Spec.Models, twv1alpha1.ModelSpec{Name: "gpt-4o-mini", Upstreams: []twv1alpha1.ModelUpstream{{Upstream: "vllm"}}})
		Expect(k8sClient.Patch(ctx, tp, patch)).To(Succeed())
		Eventually(func(g Gomega) {
			c := rendered(g, ns)
			g.Expect(c.Models).To(HaveLen(2))
			g.Expect(c.Models[0].UnavailableFallback).To(Equal("gpt-4o-mini"))
			g.Expect(c.Models[0].ContextWindow).To(Equal(int64(128000)))
			g.Expect(c.Models[0].MaxOutputTokens).To(Equal(int64(16384)))
			g.Expect(c.Models[0].Tokenizer).To(Equal("o200k_base"))
			g.Expect(c.Models[0].AdmissionPolicy).To(Equal(config.AdmitClamp))
			g.Expect(c.Models[0].AcceptsLoweredOutputCap).To(BeTrue())
			g.Expect(c.Routing.AdmissionPolicy).To(Equal(config.AdmitRefuse))
			g.Expect(c.Routing.BillingCooldownSeconds).To(Equal(int64(1800)))
			g.Expect(c.Models[0].Upstreams).To(Equal([]config.ModelUpstream{{Upstream: "azure", ProviderModel: "gpt-4o-2024-08-06"}, {Upstream: "vllm", Tokenizer: "cl100k_base"}}))
			g.Expect(c.Upstreams[0].Provider).To(Equal(config.ProviderAnthropic))
			g.Expect(c.Upstreams[2].Provider).To(Equal(config.ProviderOpenAI))
		}).Should(Succeed())
	})
})

var _ = Describe("A TokenBudget's fallback model", func() {
	It("renders into its rule, and the API server refuses it on a budget of a tenant", func() {
		ns := newNamespace("fallback")
		Expect(k8sClient.Create(ctx, credentialSecret(ns, "provider", map[string]string{"anthropic": "upstream"}))).To(Succeed())
		tp := fleetProxy(ns, 1)
		tp.Spec.Models = []twv1alpha1.ModelSpec{{Name: "gpt-4o-mini", Upstreams: []twv1alpha1.ModelUpstream{{Upstream: "vllm"}}}}
		Expect(k8sClient.Create(ctx, tp)).To(Succeed())
		b := tokenBudget(ns, "big", twv1alpha1.DimensionPerModel, "gpt-4o", 1000, 0)
		b.Spec.FallbackModel = "gpt-4o-mini"
		Expect(k8sClient.Create(ctx, b)).To(Succeed())
		Eventually(func(g Gomega) {
			rules := rendered(g, ns).RateLimiting.Rules
			g.Expect(rules).To(HaveLen(1))
			g.Expect(rules[0].Subjects).To(Equal([]string{"gpt-4o"}))
			g.Expect(rules[0].FallbackModel).To(Equal("gpt-4o-mini"))
			g.Expect(rendered(g, ns).RateLimiting.Limits.PerModel).To(BeEmpty(), "a budget that falls back is a rule, never limits.per_model")
		}).Should(Succeed())

		bad := tokenBudget(ns, "tenant", twv1alpha1.DimensionPerAPIKey, "", 1000, 0)
		bad.Spec.FallbackModel = "gpt-4o-mini"
		err := k8sClient.Create(ctx, bad)
		Expect(err).To(HaveOccurred())
		Expect(err.Error()).To(ContainSubstring("fallbackModel applies only to a PerModel budget without countBy: a budget of a tenant refuses whatever the model"))
	})
})

var _ = Describe("The upstreams' health on a TokenProxy", func() {
	It("counts the healthy upstreams of total from the replicas' reports, naming the unhealthy ones and what keeps each out", func() {
		ns := newNamespace("health")
		Expect(k8sClient.Create(ctx, credentialSecret(ns, "provider", map[string]string{"anthropic": "upstream"}))).To(Succeed())
		tp := fleetProxy(ns, 1)
		tp.Spec.Upstreams = append(tp.Spec.Upstreams, twv1alpha1.Upstream{Name: "azure", URL: "https://azure.internal"})
		tp.Spec.Models = []twv1alpha1.ModelSpec{{Name: "gpt-4o", Upstreams: []twv1alpha1.ModelUpstream{{Upstream: "azure"}, {Upstream: "vllm"}}}}
		Expect(k8sClient.Create(ctx, tp)).To(Succeed())
		Eventually(func(g Gomega) { g.Expect(rendered(g, ns).Models).To(HaveLen(1)) }).Should(Succeed())
		a, b := loadCurrent(ns, "a"), loadCurrent(ns, "b")
		a.Annotations[twv1alpha1.ReplicaUpstreamHealthAnnotation] = `[{"upstream":"azure","breaker":"open"},` +
			`{"upstream":"vllm","breaker":"closed","cooling":true,"reason":"rate","requested_seconds":20,"applied_seconds":20}]`
		b.Annotations[twv1alpha1.ReplicaUpstreamHealthAnnotation] = `[{"upstream":"azure","breaker":"open","cooling":true,"reason":"billing",` +
			`"message":"You exceeded your current quota, please check your plan and billing details.","applied_seconds":900},{"upstream":"vllm","breaker":"closed"}]`
		Expect(k8sClient.Create(ctx, a)).To(Succeed())
		Expect(k8sClient.Create(ctx, b)).To(Succeed())
		Eventually(func(g Gomega) {
			st := proxyStatus(g, ns)
			g.Expect(st.Upstreams).To(Equal("1/3"))
			g.Expect(st.UnhealthyUpstreams).To(Equal([]twv1alpha1.UnhealthyUpstream{
				{Name: "vllm", CoolingReplicas: 1, Reason: "Rate", RequestedSeconds: 20, AppliedSeconds: 20},
				{Name: "azure", OpenReplicas: 2, BillingReplicas: 1, Reason: "Billing",
					Message: "You exceeded your current quota, please check your plan and billing details.", AppliedSeconds: 900}}))
			g.Expect(st.UpstreamsOut).To(Equal("azure=billing,vllm=rate"), "the gravest first")
		}).Should(Succeed())
		rows := strings.Split(kubectl("get", "tp", "-n", ns), "\n")
		head, row := strings.Fields(rows[0]), strings.Fields(rows[1]) // empty columns print nothing
		Expect(head[len(head)-2:]).To(Equal([]string{"OUT", "AGE"}))
		Expect(row[len(row)-2]).To(Equal("azure=billing,vllm=rate"))

		By("the breakers closing and the cooldown ending")
		for _, le := range []string{"fleet-proxy-a", "fleet-proxy-b"} {
			Eventually(func(g Gomega) {
				var l coordinationv1.Lease
				g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: le}, &l)).To(Succeed())
				l.Annotations[twv1alpha1.ReplicaUpstreamHealthAnnotation] = `[{"upstream":"azure","breaker":"closed"},{"upstream":"vllm","breaker":"closed"}]`
				g.Expect(k8sClient.Update(ctx, &l)).To(Succeed())
			}).Should(Succeed())
		}
		Eventually(func(g Gomega) {
			st := proxyStatus(g, ns)
			g.Expect(st.Upstreams).To(Equal("3/3"))
			g.Expect(st.UnhealthyUpstreams).To(BeEmpty())
			g.Expect(st.UpstreamsOut).To(BeEmpty())
		}).Should(Succeed())
	})
})
