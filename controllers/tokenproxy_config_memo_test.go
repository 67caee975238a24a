// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package controllers_test

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	twv1alpha1 "github.com/tokenwarden/tokenwarden/api/v1alpha1"
	"github.com/tokenwarden/tokenwarden/proxy/config"
)

// The reconciler keeps each fleet's key order and its last config outcome between
// reconciles (issue 14): what it reuses must never hide a change.
var _ = Describe("A fleet's config, between reconciles", func() {
	// keysOf is the fleet's rendered keys as name: hash and user.
	type rendered1 struct{ hash, user string }
	keysOf := func(g Gomega, ns string) (names []string, byName map[string]rendered1) {
		byName = map[string]rendered1{}
		for _, k := range rendered(g, ns).APIKeys {
			names = append(names, k.Name)
			byName[k.Name] = rendered1{hash: k.KeySHA256, user: k.User}
		}
		return names, byName
	}
	generation := func(g Gomega, ns string) string {
		var cm corev1.ConfigMap
		g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: "fleet-proxy"}, &cm)).To(Succeed())
		return cm.Annotations["tokenwarden.io/config-generation"]
	}

	It("re-renders a changed key, drops a deleted one, places a new one in name order and follows a Secret's rotation", func() {
		ns := newNamespace("memo")
		Expect(k8sClient.Create(ctx, credentialSecret(ns, "provider", map[string]string{"anthropic": "upstream"}))).To(Succeed())
		for _, n := range []string{"a", "c", "e"} {
			Expect(k8sClient.Create(ctx, keySecret(ns, "s-"+n, "key-"+n))).To(Succeed())
			Expect(k8sClient.Create(ctx, apiKey(ns, n, "s-"+n, "user-"+n, "team"))).To(Succeed())
		}
		Expect(k8sClient.Create(ctx, fleetProxy(ns, 1))).To(Succeed())
		Eventually(func(g Gomega) {
			names, _ := keysOf(g, ns)
			g.Expect(names).To(Equal([]string{"a", "c", "e"}))
		}, time.Minute).Should(Succeed())
		before := generation(Default, ns)

		By("a changed key is rendered anew")
		Eventually(func(g Gomega) {
			k := keyObject(g, ns, "c")
			k.Spec.User = "someone-else"
			g.Expect(k8sClient.Update(ctx, k)).To(Succeed())
		}).Should(Succeed())
		Eventually(func(g Gomega) {
			_, byName := keysOf(g, ns)
			g.Expect(byName["c"].user).To(Equal("someone-else"))
		}, time.Minute).Should(Succeed())
		Expect(generation(Default, ns)).NotTo(Equal(before))

		By("a new key takes its place in name order, a deleted one leaves the document")
		Expect(k8sClient.Create(ctx, keySecret(ns, "s-d", "key-d"))).To(Succeed())
		Expect(k8sClient.Create(ctx, apiKey(ns, "d", "s-d", "user-d", "team"))).To(Succeed())
		Expect(k8sClient.Delete(ctx, &twv1alpha1.ApiKey{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "a"}})).To(Succeed())
		Eventually(func(g Gomega) {
			names, _ := keysOf(g, ns)
			g.Expect(names).To(Equal([]string{"c", "d", "e"}))
		}, time.Minute).Should(Succeed())

		By("a rotated Secret changes the key's hash, and its fingerprint")
		Eventually(func(g Gomega) {
			var s corev1.Secret
			g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: "s-e"}, &s)).To(Succeed())
			s.Data = map[string][]byte{"key": []byte("key-e-rotated")}
			g.Expect(k8sClient.Update(ctx, &s)).To(Succeed())
		}).Should(Succeed())
		Eventually(func(g Gomega) {
			_, byName := keysOf(g, ns)
			g.Expect(byName["e"].hash).To(Equal(sha("key-e-rotated")))
			g.Expect(keyObject(g, ns, "e").Status.Fingerprint).To(Equal(sha("key-e-rotated")[:8]))
		}, time.Minute).Should(Succeed())

		By("a Secret deleted takes its key out of the document")
		Expect(k8sClient.Delete(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "s-d"}})).To(Succeed())
		Eventually(func(g Gomega) {
			names, _ := keysOf(g, ns)
			g.Expect(names).To(Equal([]string{"c", "e"}))
			g.Expect(condition(keyObject(g, ns, "d").Status.Conditions, twv1alpha1.ConditionAccepted).Reason).To(Equal(twv1alpha1.ReasonSecretNotFound))
		}, time.Minute).Should(Succeed())

		By("a ConfigMap edited by hand is written back, though nothing the document is rendered from changed")
		Eventually(func(g Gomega) {
			var cm corev1.ConfigMap
			g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: "fleet-proxy"}, &cm)).To(Succeed())
			cm.Data["proxy.yaml"] = "listen: 0.0.0.0:1\n"
			g.Expect(k8sClient.Update(ctx, &cm)).To(Succeed())
		}).Should(Succeed())
		Eventually(func(g Gomega) {
			names, _ := keysOf(g, ns)
			g.Expect(names).To(Equal([]string{"c", "e"}))
			_, err := config.Parse(document(g, ns))
			g.Expect(err).NotTo(HaveOccurred())
		}, time.Minute).Should(Succeed())
	})
})
