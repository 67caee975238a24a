// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package controllers_test

import (
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

const credentialsAnnotation = "tokenwarden.io/credentials-sha256"

var _ = Describe("The credential Secrets the proxy pods read", func() {
	It("reports a missing one on the TokenProxy, and rolls the pods when one rotates", func() {
		ns := newNamespace("creds")
		Expect(k8sClient.Create(ctx, fleetProxy(ns, 1))).To(Succeed())

		By("a missing Secret: a condition and an event, and the Deployment still applied")
		Eventually(func(g Gomega) {
			acc := condition(proxyStatus(g, ns).Conditions, "Accepted")
			g.Expect(acc.Status).To(Equal(metav1.ConditionFalse))
			g.Expect(acc.Reason).To(Equal("CredentialSecretNotFound"))
			g.Expect(acc.Message).To(Equal("No Secret provider labelled tokenwarden.io/secret=credential (spec.upstreams[claude].credentialSecretRef): " +
				"the operator reads only Secrets labelled for its use; " +
				"the proxy pods cannot start while it is missing; pods already running keep the credential they started with"))
			deployment(g, ns)
			g.Expect(warningReasons(g, ns)).To(ContainElement("CredentialSecretNotFound"))
		}).Should(Succeed())

		By("the Secret created: accepted, and its hash in the pod template")
		provider := credentialSecret(ns, "provider", map[string]string{"anthropic": "sk-ant-1"})
		Expect(k8sClient.Create(ctx, provider)).To(Succeed())
		var first string
		Eventually(func(g Gomega) {
			g.Expect(condition(proxyStatus(g, ns).Conditions, "Accepted").Status).To(Equal(metav1.ConditionTrue))
			first = deployment(g, ns).Spec.Template.Annotations[credentialsAnnotation]
			g.Expect(first).To(HaveLen(64))
		}).Should(Succeed())
		Expect(first).NotTo(ContainSubstring("sk-ant-1"))

		By("a rotation: a new hash, so the pods roll")
		provider.StringData = map[string]string{"anthropic": "sk-ant-2"}
		Expect(k8sClient.Update(ctx, provider)).To(Succeed())
		var second string
		Eventually(func(g Gomega) {
			second = deployment(g, ns).Spec.Template.Annotations[credentialsAnnotation]
			g.Expect(second).To(HaveLen(64))
			g.Expect(second).NotTo(Equal(first))
		}).Should(Succeed())

		By("a key removed: a condition, and the pods not rolled into a template they cannot start")
		Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(provider), provider)).To(Succeed())
		provider.Data = map[string][]byte{"openai": []byte("sk-oai")}
		Expect(k8sClient.Update(ctx, provider)).To(Succeed())
		Eventually(func(g Gomega) {
			acc := condition(proxyStatus(g, ns).Conditions, "Accepted")
			g.Expect(acc.Reason).To(Equal("CredentialSecretKeyMissing"))
			g.Expect(acc.Message).To(HavePrefix(`Secret provider has no key "anthropic" (spec.upstreams[claude].credentialSecretRef)`))
		}).Should(Succeed())
		Expect(deployment(Default, ns).Spec.Template.Annotations).To(HaveKeyWithValue(credentialsAnnotation, second))
	})
})
