// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package controllers_test

import (
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	twv1alpha1 "github.com/tokenwarden/tokenwarden/api/v1alpha1"
)

// accepted is an object's Accepted condition, without its times.
type accepted = verdict

func acceptedOf(conds []metav1.Condition) accepted {
	return verdictOf(conds, twv1alpha1.ConditionAccepted)
}

var _ = Describe("Scoped reads", func() {
	Context("the Secrets an ApiKey may use", func() {
		It("refuses an unlabelled Secret exactly as a missing one, and reveals nothing of it", func() {
			ns := newNamespace("unlabelled")
			Expect(k8sClient.Create(ctx, credentialSecret(ns, "provider", map[string]string{"anthropic": "upstream"}))).To(Succeed())
			Expect(k8sClient.Create(ctx, fleetProxy(ns, 1))).To(Succeed())
			plain := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "plain", Namespace: ns}, StringData: map[string]string{"key": "sk-plain"}}
			Expect(k8sClient.Create(ctx, plain)).To(Succeed())
			for _, k := range []*twv1alpha1.ApiKey{
				apiKey(ns, "unlabelled", "plain", "", ""),
				apiKey(ns, "missing", "nothing", "", ""),
				apiKey(ns, "credential", "provider", "", ""), // labelled for the pods, not for ApiKeys
			} {
				Expect(k8sClient.Create(ctx, k)).To(Succeed())
			}
			notFound := func(secret string) accepted {
				return accepted{metav1.ConditionFalse, twv1alpha1.ReasonSecretNotFound,
					"No Secret " + secret + " labelled tokenwarden.io/secret=api-key in namespace " + ns}
			}
			Eventually(func(g Gomega) {
				for key, secret := range map[string]string{"unlabelled": "plain", "missing": "nothing", "credential": "provider"} {
					st := keyStatus(g, ns, key)
					g.Expect(acceptedOf(st.Conditions)).To(Equal(notFound(secret)), key)
					g.Expect(st.Fingerprint).To(BeEmpty(), key)
				}
				g.Expect(rendered(g, ns).APIKeys).To(BeEmpty())
			}).Should(Succeed())

			By("the operator's cache does not hold the unlabelled Secret")
			Expect(apierrors.IsNotFound(mgrClient.Get(ctx, client.ObjectKeyFromObject(plain), &corev1.Secret{}))).To(BeTrue())

			By("once labelled, the Secret is used")
			plain.Labels = map[string]string{twv1alpha1.SecretUsageLabel: twv1alpha1.SecretUsageAPIKey}
			Expect(k8sClient.Update(ctx, plain)).To(Succeed())
			Eventually(func(g Gomega) {
				st := keyStatus(g, ns, "unlabelled")
				g.Expect(condition(st.Conditions, twv1alpha1.ConditionAccepted).Status).To(Equal(metav1.ConditionTrue))
				g.Expect(st.Fingerprint).To(Equal(sha("sk-plain")[:8]))
			}).Should(Succeed())

			By("the label removed again: refused, and the fingerprint gone")
			Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(plain), plain)).To(Succeed())
			delete(plain.Labels, twv1alpha1.SecretUsageLabel)
			Expect(k8sClient.Update(ctx, plain)).To(Succeed())
			Eventually(func(g Gomega) {
				st := keyStatus(g, ns, "unlabelled")
				g.Expect(acceptedOf(st.Conditions)).To(Equal(notFound("plain")))
				g.Expect(st.Fingerprint).To(BeEmpty())
				g.Expect(rendered(g, ns).APIKeys).To(BeEmpty())
			}).Should(Succeed())
		})

		It("caches the objects it owns without their managed fields", func() {
			ns := newNamespace("stripped")
			Expect(k8sClient.Create(ctx, fleetProxy(ns, 1))).To(Succeed())
			Eventually(func(g Gomega) {
				var cm corev1.ConfigMap
				g.Expect(mgrClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: "fleet-proxy"}, &cm)).To(Succeed())
				g.Expect(cm.ManagedFields).To(BeEmpty())
				var stored corev1.ConfigMap
				g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(&cm), &stored)).To(Succeed())
				g.Expect(stored.ManagedFields).NotTo(BeEmpty())
			}).Should(Succeed())
		})
	})

	Context("budgets and keys from other namespaces", func() {
		It("refuses them by default, accepts them from All, and from a Selector only while the namespace carries the label", func() {
			home := newNamespace("fleet-home")
			tenant := newNamespace("tenant")
			Expect(k8sClient.Create(ctx, credentialSecret(home, "provider", map[string]string{"anthropic": "upstream"}))).To(Succeed())
			Expect(k8sClient.Create(ctx, fleetProxy(home, 1))).To(Succeed())
			b := tokenBudget(tenant, "team", twv1alpha1.DimensionPerTeam, "", 1000, 0)
			b.Spec.ProxyRef.Namespace = home
			k := apiKey(tenant, "alice", "alice", "alice", "team")
			k.Spec.ProxyRef.Namespace = home
			Expect(k8sClient.Create(ctx, keySecret(tenant, "alice", "sk-tenant-alice"))).To(Succeed())
			Expect(k8sClient.Create(ctx, b)).To(Succeed())
			Expect(k8sClient.Create(ctx, k)).To(Succeed())

			refused := func(rule string) accepted {
				return accepted{metav1.ConditionFalse, twv1alpha1.ReasonNotAllowed, "TokenProxy " + home +
					"/fleet does not accept objects from namespace " + tenant + ": its spec.allowedNamespaces " + rule}
			}
			expect := func(want accepted, keys int) {
				GinkgoHelper()
				Eventually(func(g Gomega) {
					g.Expect(acceptedOf(budgetStatus(g, tenant, "team").Conditions)).To(Equal(want))
					g.Expect(acceptedOf(keyStatus(g, tenant, "alice").Conditions)).To(Equal(want))
					g.Expect(rendered(g, home).APIKeys).To(HaveLen(keys))
				}).Should(Succeed())
			}
			setAllowed := func(an twv1alpha1.AllowedNamespaces) {
				GinkgoHelper()
				var tp twv1alpha1.TokenProxy
				Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: home, Name: "fleet"}, &tp)).To(Succeed())
				patch := client.MergeFrom(tp.DeepCopy())
				tp.Spec.AllowedNamespaces = an
				Expect(k8sClient.Patch(ctx, &tp, patch)).To(Succeed())
			}

			By("from: Same (the default)")
			expect(refused("is from: Same, its own namespace only"), 0)

			By("from: All")
			setAllowed(twv1alpha1.AllowedNamespaces{From: twv1alpha1.NamespacesFromAll})
			Eventually(func(g Gomega) {
				g.Expect(acceptedOf(keyStatus(g, tenant, "alice").Conditions)).To(Equal(
					accepted{metav1.ConditionTrue, twv1alpha1.ReasonAccepted, "The key is in force"}))
				g.Expect(acceptedOf(budgetStatus(g, tenant, "team").Conditions)).To(Equal(
					accepted{metav1.ConditionTrue, twv1alpha1.ReasonAccepted, "The budget is in force"}))
				g.Expect(rendered(g, home).APIKeys).To(ConsistOf(And(HaveField("Name", tenant+"_alice"), HaveField("KeySHA256", sha("sk-tenant-alice")))))
			}).Should(Succeed())

			By("from: Selector, the namespace without the label")
			setAllowed(twv1alpha1.AllowedNamespaces{From: twv1alpha1.NamespacesFromSelector,
				Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"tokenwarden.io/fleet": "shared"}}})
			expect(refused("selects namespaces by labels tokenwarden.io/fleet=shared, which namespace "+tenant+" does not carry"), 0)

			By("the label added to the namespace")
			var n corev1.Namespace
			Expect(k8sClient.Get(ctx, client.ObjectKey{Name: tenant}, &n)).To(Succeed())
			n.Labels["tokenwarden.io/fleet"] = "shared"
			Expect(k8sClient.Update(ctx, &n)).To(Succeed())
			Eventually(func(g Gomega) {
				g.Expect(condition(keyStatus(g, tenant, "alice").Conditions, twv1alpha1.ConditionAccepted).Status).To(Equal(metav1.ConditionTrue))
				g.Expect(condition(budgetStatus(g, tenant, "team").Conditions, twv1alpha1.ConditionAccepted).Status).To(Equal(metav1.ConditionTrue))
				g.Expect(rendered(g, home).APIKeys).To(HaveLen(1))
			}).Should(Succeed())

			By("the label removed again")
			Expect(k8sClient.Get(ctx, client.ObjectKey{Name: tenant}, &n)).To(Succeed())
			delete(n.Labels, "tokenwarden.io/fleet")
			Expect(k8sClient.Update(ctx, &n)).To(Succeed())
			expect(refused("selects namespaces by labels tokenwarden.io/fleet=shared, which namespace "+tenant+" does not carry"), 0)
		})
	})

	It("names the namespace of a missing fleet in another namespace", func() {
		tenant := newNamespace("lost-tenant")
		b := tokenBudget(tenant, "team", twv1alpha1.DimensionPerTeam, "", 1000, 0)
		b.Spec.ProxyRef = twv1alpha1.ProxyReference{Namespace: "elsewhere", Name: "nothing"}
		Expect(k8sClient.Create(ctx, b)).To(Succeed())
		Eventually(func(g Gomega) {
			g.Expect(acceptedOf(budgetStatus(g, tenant, "team").Conditions)).To(Equal(
				accepted{metav1.ConditionFalse, twv1alpha1.ReasonProxyNotFound, "TokenProxy elsewhere/nothing not found"}))
		}).Should(Succeed())
	})

	Context("bypass keys", func() {
		It("refuses them unless the fleet allows them, and only in the namespaces it allows them in", func() {
			home := newNamespace("bypass-home")
			tenant := newNamespace("bypass-tenant")
			Expect(k8sClient.Create(ctx, credentialSecret(home, "provider", map[string]string{"anthropic": "upstream"}))).To(Succeed())
			tp := fleetProxy(home, 1)
			tp.Spec.AllowedNamespaces.From = twv1alpha1.NamespacesFromAll
			Expect(k8sClient.Create(ctx, tp)).To(Succeed())
			own := apiKey(home, "ops", "ops", "", "")
			own.Spec.Bypass = true
			other := apiKey(tenant, "ops", "ops", "", "")
			other.Spec.Bypass, other.Spec.ProxyRef.Namespace = true, home
			for _, o := range []client.Object{keySecret(home, "ops", "sk-ops"), keySecret(tenant, "ops", "sk-tenant-ops"), own, other} {
				Expect(k8sClient.Create(ctx, o)).To(Succeed())
			}
			inForce := accepted{metav1.ConditionTrue, twv1alpha1.ReasonAccepted, "The key is in force"}
			expect := func(wantOwn, wantOther accepted) {
				GinkgoHelper()
				Eventually(func(g Gomega) {
					g.Expect(acceptedOf(keyStatus(g, home, "ops").Conditions)).To(Equal(wantOwn))
					g.Expect(acceptedOf(keyStatus(g, tenant, "ops").Conditions)).To(Equal(wantOther))
				}).Should(Succeed())
			}
			setBypass := func(p twv1alpha1.BypassPolicy) {
				GinkgoHelper()
				// A merge patch: the operator writes the fleet's status meanwhile, which
				// would make an update of what was read conflict.
				patch := client.MergeFrom(tp.DeepCopy())
				tp.Spec.AllowBypass = p
				Expect(k8sClient.Patch(ctx, tp, patch)).To(Succeed())
			}

			By("allowBypass: None (the default)")
			none := accepted{metav1.ConditionFalse, twv1alpha1.ReasonBypassNotAllowed,
				"The key sets bypass, and TokenProxy " + home + "/fleet allows no bypass key (spec.allowBypass: None)"}
			expect(none, none)
			Eventually(func(g Gomega) { g.Expect(rendered(g, home).APIKeys).To(BeEmpty()) }).Should(Succeed())

			By("allowBypass: Same")
			setBypass(twv1alpha1.BypassSame)
			expect(inForce, accepted{metav1.ConditionFalse, twv1alpha1.ReasonBypassNotAllowed,
				"The key sets bypass, and TokenProxy " + home + "/fleet allows bypass only for keys in its own namespace (spec.allowBypass: Same)"})
			Eventually(func(g Gomega) {
				g.Expect(rendered(g, home).APIKeys).To(ConsistOf(And(HaveField("Name", "ops"), HaveField("Bypass", true))))
			}).Should(Succeed())

			By("allowBypass: All")
			setBypass(twv1alpha1.BypassAll)
			expect(inForce, inForce)
			Eventually(func(g Gomega) { g.Expect(rendered(g, home).APIKeys).To(HaveLen(2)) }).Should(Succeed())
		})
	})
})
