// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package controllers_test

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	twv1alpha1 "github.com/tokenwarden/tokenwarden/api/v1alpha1"
)

func keyStatus(g Gomega, ns, name string) twv1alpha1.ApiKeyStatus {
	var k twv1alpha1.ApiKey
	g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &k)).To(Succeed())
	return k.Status
}

// A document the proxy would refuse is never written.
var _ = Describe("The fleet reconciler, on what the proxy would refuse", func() {
	It("keeps the oldest of two ApiKeys whose Secrets hold the same key and marks the other Conflicted", func() {
		ns := newNamespace("dupkey")
		Expect(k8sClient.Create(ctx, fleetProxy(ns, 1))).To(Succeed())
		Expect(k8sClient.Create(ctx, keySecret(ns, "zed", "sk-shared"))).To(Succeed())
		Expect(k8sClient.Create(ctx, keySecret(ns, "amy", "sk-shared"))).To(Succeed())
		Expect(k8sClient.Create(ctx, apiKey(ns, "zed", "zed", "zed", ""))).To(Succeed())
		time.Sleep(1100 * time.Millisecond) // creation timestamps have a resolution of one second
		Expect(k8sClient.Create(ctx, apiKey(ns, "amy", "amy", "amy", ""))).To(Succeed())
		Eventually(func(g Gomega) {
			acc := condition(keyStatus(g, ns, "amy").Conditions, "Accepted")
			g.Expect(acc.Status).To(Equal(metav1.ConditionFalse))
			g.Expect(acc.Reason).To(Equal("Conflicted"))
			g.Expect(acc.Message).To(Equal("ApiKey zed is older and its Secret holds the same key"))
			g.Expect(condition(keyStatus(g, ns, "amy").Conditions, "Ready").Status).To(Equal(metav1.ConditionFalse))
			g.Expect(condition(keyStatus(g, ns, "zed").Conditions, "Accepted").Status).To(Equal(metav1.ConditionTrue))
			keys := rendered(g, ns).APIKeys
			g.Expect(keys).To(HaveLen(1))
			g.Expect(keys[0].Name).To(Equal("zed"))
			g.Expect(keys[0].KeySHA256).To(Equal(sha("sk-shared")))
		}).Should(Succeed())

		By("the older key's deletion letting the other in")
		Expect(k8sClient.Delete(ctx, apiKey(ns, "zed", "zed", "", ""))).To(Succeed())
		Eventually(func(g Gomega) {
			g.Expect(condition(keyStatus(g, ns, "amy").Conditions, "Accepted").Status).To(Equal(metav1.ConditionTrue))
			g.Expect(rendered(g, ns).APIKeys).To(ConsistOf(HaveField("Name", "amy")))
		}).Should(Succeed())
	})

	It("writes no config the proxy's own validation refuses, and says why on the TokenProxy", func() {
		ns := newNamespace("invalid")
		Expect(k8sClient.Create(ctx, credentialSecret(ns, "provider", map[string]string{"anthropic": "upstream"}))).To(Succeed())
		tp := fleetProxy(ns, 1)
		tp.Spec.Upstreams[1].URL = "http://vllm.models.svc:8000/v1?tenant=a" // the CRD allows it; the proxy does not
		Expect(k8sClient.Create(ctx, tp)).To(Succeed())
		Eventually(func(g Gomega) {
			st := proxyStatus(g, ns)
			acc := condition(st.Conditions, "Accepted")
			g.Expect(acc.Status).To(Equal(metav1.ConditionFalse))
			g.Expect(acc.Reason).To(Equal("InvalidConfig"))
			g.Expect(acc.Message).To(Equal("The rendered proxy config is not written, because the proxy would refuse it; the fleet keeps its last config: " +
				`upstreams[1].url: must not carry a query or fragment, got "http://vllm.models.svc:8000/v1?tenant=a"`))
			g.Expect(st.ObservedGeneration).To(Equal(tp.Generation))
		}).Should(Succeed())
		Consistently(func() bool {
			return apierrors.IsNotFound(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: "fleet-proxy"}, &corev1.ConfigMap{}))
		}, "500ms").Should(BeTrue(), "no ConfigMap is written")
		Eventually(func(g Gomega) {
			g.Expect(warningReasons(g, ns)).To(ContainElement("InvalidConfig"))
		}).Should(Succeed())

		By("a fixed spec rendering and accepting the fleet")
		Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(tp), tp)).To(Succeed())
		patch := client.MergeFrom(tp.DeepCopy())
		tp.Spec.Upstreams[1].URL = "http://vllm.models.svc:8000/v1"
		Expect(k8sClient.Patch(ctx, tp, patch)).To(Succeed())
		Eventually(func(g Gomega) {
			g.Expect(rendered(g, ns).Upstreams[1].URL).To(Equal("http://vllm.models.svc:8000/v1"))
			g.Expect(condition(proxyStatus(g, ns).Conditions, "Accepted").Reason).To(Equal("Accepted"))
		}).Should(Succeed())
	})
})
