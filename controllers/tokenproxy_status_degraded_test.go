// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package controllers_test

import (
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Errors are conditions: a failing step never stops the steps that do not depend on it.
var _ = Describe("The fleet reconciler, when a step fails", func() {
	It("still scales the Deployment while the ConfigMap cannot be written, says Degraded=ConfigMapFailed, and clears it when fixed", func() {
		ns := newNamespace("degraded")
		Expect(k8sClient.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "provider", Namespace: ns,
			Labels: map[string]string{"tokenwarden.io/secret": "credential"}},
			StringData: map[string]string{"anthropic": "upstream"}})).To(Succeed())
		// A ConfigMap of the fleet's name that another controller owns: the operator
		// cannot adopt it (and, without the operator's label, its cache does not even
		// hold it: the create says it already exists).
		foreign := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "fleet-proxy", Namespace: ns,
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "ConfigMap", Name: "someone-else",
				UID: types.UID("00000000-0000-0000-0000-000000000001"), Controller: ptr.To(true)}}},
			Data: map[string]string{"proxy.yaml": "not ours"}}
		Expect(k8sClient.Create(ctx, foreign)).To(Succeed())
		tp := fleetProxy(ns, 2)
		Expect(k8sClient.Create(ctx, tp)).To(Succeed())
		Eventually(func(g Gomega) {
			g.Expect(deployment(g, ns).Spec.Replicas).To(HaveValue(Equal(int32(2))), "the Deployment step runs")
			deg := condition(proxyStatus(g, ns).Conditions, "Degraded")
			g.Expect(deg.Status).To(Equal(metav1.ConditionTrue))
			g.Expect(deg.Reason).To(Equal("ConfigMapFailed"))
			g.Expect(deg.Message).To(ContainSubstring("ConfigMap: apply ConfigMap"))
			g.Expect(deg.Message).To(ContainSubstring(`"fleet-proxy" already exists`), "the message names the object in the way")
			var svc corev1.Service
			g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: "fleet-proxy-admin"}, &svc)).To(Succeed(), "the Services step runs")
		}).Should(Succeed())
		Eventually(func(g Gomega) {
			g.Expect(warningReasons(g, ns)).To(ContainElement("ConfigMapFailed"))
		}).Should(Succeed())

		By("a scale while the ConfigMap still fails")
		Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(tp), tp)).To(Succeed())
		patch := client.MergeFrom(tp.DeepCopy())
		tp.Spec.Replicas = ptr.To(int32(3))
		Expect(k8sClient.Patch(ctx, tp, patch)).To(Succeed())
		Eventually(func(g Gomega) {
			g.Expect(deployment(g, ns).Spec.Replicas).To(HaveValue(Equal(int32(3))))
		}).Should(Succeed())

		By("the foreign ConfigMap's removal clearing Degraded")
		Expect(k8sClient.Delete(ctx, foreign)).To(Succeed())
		Eventually(func(g Gomega) {
			g.Expect(rendered(g, ns).RateLimiting.BudgetDivision.Replicas).To(Equal(int64(3)))
			deg := condition(proxyStatus(g, ns).Conditions, "Degraded")
			g.Expect(deg.Status).To(Equal(metav1.ConditionFalse))
			g.Expect(deg.Reason).To(Equal("Reconciled"))
		}).Should(Succeed())
	})

	It("still scales the Deployment while the rendered config is refused", func() {
		ns := newNamespace("refusedscale")
		Expect(k8sClient.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "provider", Namespace: ns,
			Labels: map[string]string{"tokenwarden.io/secret": "credential"}},
			StringData: map[string]string{"anthropic": "upstream"}})).To(Succeed())
		tp := fleetProxy(ns, 1)
		Expect(k8sClient.Create(ctx, tp)).To(Succeed())
		Eventually(func(g Gomega) { g.Expect(rendered(g, ns).Upstreams).To(HaveLen(2)) }).Should(Succeed())

		Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(tp), tp)).To(Succeed())
		patch := client.MergeFrom(tp.DeepCopy())
		tp.Spec.Upstreams[1].URL = "http://vllm.models.svc:8000/v1?tenant=a" // the proxy refuses it
		tp.Spec.Replicas = ptr.To(int32(2))
		Expect(k8sClient.Patch(ctx, tp, patch)).To(Succeed())
		Eventually(func(g Gomega) {
			g.Expect(condition(proxyStatus(g, ns).Conditions, "Accepted").Reason).To(Equal("InvalidConfig"))
			g.Expect(deployment(g, ns).Spec.Replicas).To(HaveValue(Equal(int32(2))), "the refused config does not stop the scale")
			g.Expect(rendered(g, ns).Upstreams[1].URL).To(Equal("http://vllm.models.svc:8000/v1base"), "the last good config stays")
			g.Expect(condition(proxyStatus(g, ns).Conditions, "Degraded").Status).To(Equal(metav1.ConditionFalse),
				"a refused config is the spec's fault, said by Accepted, not a failed step")
		}).Should(Succeed())
	})
})
