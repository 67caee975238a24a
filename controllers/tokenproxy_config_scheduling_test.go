// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package controllers_test

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	twv1alpha1 "github.com/tokenwarden/tokenwarden/api/v1alpha1"
	"github.com/tokenwarden/tokenwarden/proxy/config"
)

var _ = Describe("A fleet's scheduling", func() {
	It("renders capacity, class bounds and the keys' priority, weight and limits for agents, and drains for the longest wait", func() {
		ns := newNamespace("scheduling")
		tp := fleetProxy(ns, 1)
		tp.Spec.Upstreams[1].TimeoutSeconds = 250
		tp.Spec.Upstreams[1].Capacity = &twv1alpha1.UpstreamCapacity{MaxInFlightRequests: 16, MaxInFlightTokens: 64000}
		tp.Spec.Scheduling = &twv1alpha1.SchedulingSpec{
			MaxQueueWaitSeconds: 20, MaxQueueBytes: 1 << 20, AgingSeconds: 5, OutputWeight: ptr.To(resource.MustParse("1.5")), MaxRuns: 500,
			Interactive: &twv1alpha1.ClassSpec{MaxQueueWaitSeconds: 2, MaxOutputTokens: 4096},
			Batch:       &twv1alpha1.ClassSpec{MinSharePercent: 20},
			Background:  &twv1alpha1.ClassSpec{MaxQueueWaitSeconds: 200, MaxOutputTokens: 8192, OverMaxOutputTokens: twv1alpha1.OverMaxOutputTokensRefuse},
		}
		k := apiKey(ns, "agent", "agent", "", "research")
		k.Spec.Priority, k.Spec.Weight = twv1alpha1.PriorityBatch, 3
		k.Spec.MaxInFlight, k.Spec.RunTokenBudget, k.Spec.RunMaxSteps = 4, 200000, 50
		for _, o := range []client.Object{keySecret(ns, "agent", "sk-agent"),
			credentialSecret(ns, "provider", map[string]string{"anthropic": "upstream"}), k, tp} {
			Expect(k8sClient.Create(ctx, o)).To(Succeed())
		}
		Eventually(func(g Gomega) {
			c := rendered(g, ns)
			g.Expect(c.Upstreams[0].Capacity).To(BeNil())
			g.Expect(c.Upstreams[1].Capacity).To(Equal(&config.Capacity{MaxInFlightRequests: 16, MaxInFlightTokens: 64000}))
			sc := &c.Scheduling
			g.Expect(sc.OutputTokenWeight()).To(Equal(1.5))
			g.Expect(sc.Aging()).To(Equal(5 * time.Second))
			g.Expect(sc.QueueBytes()).To(Equal(int64(1 << 20)))
			g.Expect(sc.Classes.Of(config.PriorityInteractive).MaxQueueWait(sc)).To(Equal(2 * time.Second))
			g.Expect(sc.Classes.Of(config.PriorityBatch).MaxQueueWait(sc)).To(Equal(20 * time.Second))
			g.Expect(sc.Classes.MinShare(config.PriorityBatch)).To(Equal(0.20))
			g.Expect(sc.Classes.MinShare(config.PriorityBackground)).To(Equal(0.05), "the proxy's default where the resource sets none")
			g.Expect(sc.Classes.Background).To(Equal(config.ClassLimits{MaxQueueWaitSeconds: 200, MaxOutputTokens: 8192, OverMaxOutputTokens: config.OverRefuse}))
			g.Expect(c.Agents.Runs()).To(Equal(500))
			g.Expect(c.APIKeys).To(HaveLen(1))
			key := c.APIKeys[0]
			g.Expect(key.Priority).To(Equal(config.PriorityBatch))
			g.Expect(key.Weight).To(Equal(3.0))
			g.Expect([]int64{key.MaxInFlight, key.RunTokenBudget, key.RunMaxSteps}).To(Equal([]int64{4, 200000, 50}))
			// The upstream with a capacity drains its timeout plus the longest class's
			// wait: 250 + 200 s, past the other upstream's 300.
			g.Expect(*deployment(g, ns).Spec.Template.Spec.TerminationGracePeriodSeconds).To(Equal(int64(5 + 450 + 10)))
		}).Should(Succeed())
		// Under memory storage the key's limits for agents are each replica's own, and
		// its Ready condition says so.
		Eventually(func(g Gomega) {
			var got twv1alpha1.ApiKey
			g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(k), &got)).To(Succeed())
			ready := meta.FindStatusCondition(got.Status.Conditions, twv1alpha1.ConditionReady)
			g.Expect(ready).NotTo(BeNil())
			g.Expect(ready.Message).To(ContainSubstring("maxInFlight, runTokenBudget, runMaxSteps: each replica's own, not divided (memory storage)"))
		}).Should(Succeed())
	})

	Context("refused by the API server with a message naming the field", func() {
		var ns string
		BeforeEach(func() { ns = newNamespace("scheduling-invalid") })
		refused := func(obj client.Object, message string) {
			GinkgoHelper()
			obj.SetNamespace(ns)
			obj.SetName("bad")
			err := k8sClient.Create(ctx, obj)
			Expect(apierrors.IsInvalid(err)).To(BeTrue(), "expected Invalid, got %v", err)
			Expect(err.Error()).To(ContainSubstring(message))
		}
		proxy := func(mutate func(*twv1alpha1.TokenProxySpec)) *twv1alpha1.TokenProxy {
			p := &twv1alpha1.TokenProxy{Spec: twv1alpha1.TokenProxySpec{
				Upstreams: []twv1alpha1.Upstream{{Name: "default", URL: "http://llm:8000"}},
			}}
			mutate(&p.Spec)
			return p
		}
		key := func(mutate func(*twv1alpha1.ApiKeySpec)) *twv1alpha1.ApiKey {
			k := &twv1alpha1.ApiKey{Spec: twv1alpha1.ApiKeySpec{ProxyRef: twv1alpha1.ProxyReference{Name: "fleet"},
				SecretRef: twv1alpha1.SecretKeyReference{Name: "s"}}}
			mutate(&k.Spec)
			return k
		}
		DescribeTable("a TokenProxy",
			func(mutate func(*twv1alpha1.TokenProxySpec), message string) { refused(proxy(mutate), message) },
			Entry("a capacity that bounds nothing",
				func(s *twv1alpha1.TokenProxySpec) { s.Upstreams[0].Capacity = &twv1alpha1.UpstreamCapacity{} },
				"spec.upstreams[0].capacity: Invalid value: capacity needs maxInFlightRequests or maxInFlightTokens"),
			Entry("a negative capacity",
				func(s *twv1alpha1.TokenProxySpec) {
					s.Upstreams[0].Capacity = &twv1alpha1.UpstreamCapacity{MaxInFlightRequests: 4, MaxInFlightTokens: -1}
				},
				"spec.upstreams[0].capacity.maxInFlightTokens: Invalid value: -1"),
			Entry("a class's wait beyond ten minutes",
				func(s *twv1alpha1.TokenProxySpec) {
					s.Scheduling = &twv1alpha1.SchedulingSpec{Batch: &twv1alpha1.ClassSpec{MaxQueueWaitSeconds: 601}}
				},
				"spec.scheduling.batch.maxQueueWaitSeconds: Invalid value: 601"),
			Entry("an action without a cap",
				func(s *twv1alpha1.TokenProxySpec) {
					s.Scheduling = &twv1alpha1.SchedulingSpec{Interactive: &twv1alpha1.ClassSpec{OverMaxOutputTokens: twv1alpha1.OverMaxOutputTokensRefuse}}
				},
				"spec.scheduling.interactive: Invalid value: overMaxOutputTokens needs maxOutputTokens"),
			Entry("an unknown action",
				func(s *twv1alpha1.TokenProxySpec) {
					s.Scheduling = &twv1alpha1.SchedulingSpec{Interactive: &twv1alpha1.ClassSpec{MaxOutputTokens: 10, OverMaxOutputTokens: "Truncate"}}
				},
				`spec.scheduling.interactive.overMaxOutputTokens: Unsupported value: "Truncate"`),
			Entry("a minimum share for interactive",
				func(s *twv1alpha1.TokenProxySpec) {
					s.Scheduling = &twv1alpha1.SchedulingSpec{Interactive: &twv1alpha1.ClassSpec{MinSharePercent: 10}}
				},
				"spec.scheduling.interactive.minSharePercent: Invalid value: interactive is served first and has no minimum share"),
			Entry("a minimum share above half",
				func(s *twv1alpha1.TokenProxySpec) {
					s.Scheduling = &twv1alpha1.SchedulingSpec{Batch: &twv1alpha1.ClassSpec{MinSharePercent: 51}}
				},
				"spec.scheduling.batch.minSharePercent: Invalid value: 51"),
			Entry("an output weight of 0",
				func(s *twv1alpha1.TokenProxySpec) {
					s.Scheduling = &twv1alpha1.SchedulingSpec{OutputWeight: ptr.To(resource.MustParse("0"))}
				},
				"spec.scheduling.outputWeight: Invalid value: \"0\": outputWeight must be greater than 0"),
		)
		DescribeTable("an ApiKey",
			func(mutate func(*twv1alpha1.ApiKeySpec), message string) { refused(key(mutate), message) },
			Entry("an unknown priority",
				func(s *twv1alpha1.ApiKeySpec) { s.Priority = "Urgent" },
				`spec.priority: Unsupported value: "Urgent"`),
			Entry("a weight above 1000",
				func(s *twv1alpha1.ApiKeySpec) { s.Weight = 1001 },
				"spec.weight: Invalid value: 1001"),
			Entry("a negative run budget",
				func(s *twv1alpha1.ApiKeySpec) { s.RunTokenBudget = -1 },
				"spec.runTokenBudget: Invalid value: -1"),
			Entry("a negative step cap",
				func(s *twv1alpha1.ApiKeySpec) { s.RunMaxSteps = -1 },
				"spec.runMaxSteps: Invalid value: -1"),
			Entry("a negative in-flight limit",
				func(s *twv1alpha1.ApiKeySpec) { s.MaxInFlight = -1 },
				"spec.maxInFlight: Invalid value: -1"),
		)
	})
})
