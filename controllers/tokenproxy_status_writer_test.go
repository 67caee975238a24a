// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package controllers_test

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	twv1alpha1 "github.com/tokenwarden/tokenwarden/api/v1alpha1"
	"github.com/tokenwarden/tokenwarden/test/bulk"
)

// A burst of new keys leaves thousands of key statuses to write; a scale must not
// wait behind them (issue 38).
var _ = Describe("A scale during a burst of key status writes", func() {
	const (
		keys  = 3000
		bound = 5 * time.Second
	)

	deploymentReplicas := func(g Gomega, ns string) int32 {
		var d appsv1.Deployment
		g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: "fleet-proxy"}, &d)).To(Succeed())
		return ptr.Deref(d.Spec.Replicas, 1)
	}
	readyKeys := func(g Gomega, ns string) int {
		var list twv1alpha1.ApiKeyList
		g.Expect(k8sClient.List(ctx, &list, client.InNamespace(ns))).To(Succeed())
		n := 0
		for _, k := range list.Items {
			if meta.IsStatusConditionTrue(k.Status.Conditions, twv1alpha1.ConditionReady) && k.Status.ObservedGeneration == k.Generation {
				n++
			}
		}
		return n
	}

	It("reaches the Deployment within seconds, before a render under way, then the rendered division, and every key's status follows", func() {
		ns := newNamespace("burst")
		start := time.Now()
		Expect(bulk.CreateShortKeys(ctx, k8sClient, ns, "fleet", 0, keys, 32)).To(Succeed())
		GinkgoWriter.Printf("created %d Secrets and ApiKeys in %s\n", keys, time.Since(start))
		Expect(k8sClient.Create(ctx, credentialSecret(ns, "provider", map[string]string{"anthropic": "upstream"}))).To(Succeed())
		Expect(k8sClient.Create(ctx, fleetProxy(ns, 1))).To(Succeed())
		Eventually(func(g Gomega) {
			g.Expect(rendered(g, ns).APIKeys).To(HaveLen(keys))
		}, 2*time.Minute, time.Second).Should(Succeed())
		Expect(readyKeys(Default, ns)).To(BeNumerically("<", keys/2), "the key statuses are still being written")

		scaled := time.Now()
		var tp twv1alpha1.TokenProxy
		Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: "fleet"}, &tp)).To(Succeed())
		patch := client.MergeFrom(tp.DeepCopy())
		tp.Spec.Replicas = ptr.To[int32](3)
		Expect(k8sClient.Patch(ctx, &tp, patch)).To(Succeed())
		Eventually(func(g Gomega) {
			g.Expect(deploymentReplicas(g, ns)).To(Equal(int32(3)))
			g.Expect(rendered(g, ns).RateLimiting.BudgetDivision.Replicas).To(Equal(int64(3)))
		}, bound, 100*time.Millisecond).Should(Succeed(), "the scale waited behind the key statuses")
		GinkgoWriter.Printf("scale reached the Deployment and the division in %s, %d of %d keys Ready then\n",
			time.Since(scaled), readyKeys(Default, ns), keys)

		// Another fleet is not held up either: neither its Deployment nor its key's
		// status, which takes its turn beside the first fleet's backlog.
		other := newNamespace("burst-other")
		Expect(bulk.CreateShortKeys(ctx, k8sClient, other, "fleet", 0, 1, 1)).To(Succeed())
		Expect(k8sClient.Create(ctx, credentialSecret(other, "provider", map[string]string{"anthropic": "upstream"}))).To(Succeed())
		created := time.Now()
		Expect(k8sClient.Create(ctx, fleetProxy(other, 2))).To(Succeed())
		Eventually(func(g Gomega) int32 { return deploymentReplicas(g, other) }, bound, 100*time.Millisecond).Should(Equal(int32(2)))
		Eventually(func(g Gomega) int { return readyKeys(g, other) }, bound, 100*time.Millisecond).Should(Equal(1),
			"the other fleet's key status waited behind the first fleet's")
		pending := keys - readyKeys(Default, ns)
		GinkgoWriter.Printf("the other fleet's key Ready %s after its fleet's create, %d of the first fleet's keys not Ready then\n",
			time.Since(created), pending)
		Expect(pending).To(BeNumerically(">", 0), "the first fleet's backlog was written before the other fleet's key: the check proves nothing")

		By("a scale while a render of the fleet's config is under way and held")
		started, release := readsOf.holdConfigMaps(ns)
		DeferCleanup(release)
		Expect(bulk.CreateShortKeys(ctx, k8sClient, ns, "fleet", keys, 1, 1)).To(Succeed())
		Eventually(started, time.Minute).Should(BeClosed(), "the new key's render writes the config")
		scaled = time.Now()
		Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: "fleet"}, &tp)).To(Succeed())
		patch = client.MergeFrom(tp.DeepCopy())
		tp.Spec.Replicas = ptr.To[int32](5)
		Expect(k8sClient.Patch(ctx, &tp, patch)).To(Succeed())
		Eventually(func(g Gomega) int32 { return deploymentReplicas(g, ns) }, bound, 100*time.Millisecond).Should(Equal(int32(5)),
			"the scale waited behind the render")
		GinkgoWriter.Printf("scale reached the Deployment in %s while the render was held\n", time.Since(scaled))
		release()
		Consistently(func(g Gomega) int32 { return deploymentReplicas(g, ns) }, 2*time.Second, 100*time.Millisecond).Should(Equal(int32(5)),
			"the released reconcile applied the size it read before the scale")
		Eventually(func(g Gomega) {
			g.Expect(rendered(g, ns).APIKeys).To(HaveLen(keys + 1))
			g.Expect(rendered(g, ns).RateLimiting.BudgetDivision.Replicas).To(Equal(int64(5)))
		}, time.Minute, 100*time.Millisecond).Should(Succeed(), "the division follows once the config is written")
		Expect(deploymentReplicas(Default, ns)).To(Equal(int32(5)))

		Eventually(func(g Gomega) int { return readyKeys(g, ns) }, 5*time.Minute, time.Second).Should(Equal(keys + 1))
		GinkgoWriter.Printf("every key Ready %s after the scale\n", time.Since(scaled))
	})
})
