// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package controllers_test

import (
	"slices"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	twv1alpha1 "github.com/tokenwarden/tokenwarden/api/v1alpha1"
	"github.com/tokenwarden/tokenwarden/proxy/config"
	"github.com/tokenwarden/tokenwarden/test/bulk"
)

// A large fleet's config passes the 1 MiB of a ConfigMap (issue 14): it travels as
// content-addressed chunks and a manifest.
var _ = Describe("A fleet whose config passes 1 MiB", func() {
	const keys = 1500 // about 800 bytes each with long names, users and teams: 1.2 MB

	chunksOf := func(g Gomega, ns string) []corev1.ConfigMap {
		var cms corev1.ConfigMapList
		g.Expect(k8sClient.List(ctx, &cms, client.InNamespace(ns), client.MatchingLabels{"tokenwarden.io/config-chunk-of": "fleet-proxy"})).To(Succeed())
		return cms.Items
	}
	manifestOf := func(g Gomega, ns string) *config.Manifest {
		var cm corev1.ConfigMap
		g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: "fleet-proxy"}, &cm)).To(Succeed())
		g.Expect(cm.Data).NotTo(HaveKey("proxy.yaml"))
		m, err := config.ParseManifest([]byte(cm.Data[config.ManifestKey]))
		g.Expect(err).NotTo(HaveOccurred())
		return m
	}
	names := func(cms []corev1.ConfigMap) []string {
		out := make([]string, 0, len(cms))
		for _, cm := range cms {
			out = append(out, cm.Name)
		}
		return out
	}

	It("renders chunks and a manifest, none over the limit, and the fleet is Accepted", func() {
		ns := newNamespace("large")
		start := time.Now()
		Expect(bulk.CreateKeys(ctx, k8sClient, ns, "fleet", keys)).To(Succeed())
		GinkgoWriter.Printf("created %d Secrets and ApiKeys in %s\n", keys, time.Since(start))
		Expect(k8sClient.Create(ctx, credentialSecret(ns, "provider", map[string]string{"anthropic": "upstream"}))).To(Succeed())
		Expect(k8sClient.Create(ctx, fleetProxy(ns, 1))).To(Succeed())

		var m *config.Manifest
		Eventually(func(g Gomega) {
			c := rendered(g, ns)
			g.Expect(c.APIKeys).To(HaveLen(keys))
			m = manifestOf(g, ns)
		}, 2*time.Minute).Should(Succeed())
		doc := document(Default, ns)
		GinkgoWriter.Printf("rendered %d keys: %d bytes in %d chunks, %s after the keys\n", keys, len(doc), len(m.Chunks), time.Since(start))
		Expect(len(doc)).To(BeNumerically(">", 1<<20))
		Expect(string(doc)).To(HavePrefix("{"), "a document too large for one ConfigMap is rendered as JSON, which the proxies parse fast")
		Expect(m.Digest).To(Equal(config.Digest(doc)))
		Expect(len(m.Chunks)).To(BeNumerically(">=", 3), "chunks of keys and the tail")

		chunks := chunksOf(Default, ns)
		Expect(names(chunks)).To(ConsistOf(m.Chunks))
		for _, cm := range chunks {
			Expect(cm.Immutable).To(HaveValue(BeTrue()))
			Expect(len(cm.Data[config.ChunkKey])).To(BeNumerically("<=", config.MaxInline))
			Expect(cm.Labels).To(HaveKeyWithValue("app.kubernetes.io/managed-by", "tokenwarden"))
			Expect(metav1.GetControllerOf(&cm)).To(HaveField("Kind", "TokenProxy"))
		}

		// The pods may get their chunks by name, and no other ConfigMap.
		var role rbacv1.Role
		Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: "fleet-proxy"}, &role)).To(Succeed())
		Expect(role.Rules).To(ContainElement(rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"configmaps"},
			ResourceNames: []string{"fleet-proxy"}, Verbs: []string{"get", "list", "watch"}}))
		Expect(role.Rules).To(ContainElement(HaveField("ResourceNames", ConsistOf(m.Chunks))))

		Eventually(func(g Gomega) {
			st := proxyStatus(g, ns)
			accepted := condition(st.Conditions, twv1alpha1.ConditionAccepted)
			g.Expect(accepted.Status).To(Equal(metav1.ConditionTrue), accepted.Message)
			g.Expect(st.ConfigGeneration).To(Equal(m.Generation))
		}, time.Minute).Should(Succeed())

		// A replica that reports the generation and the whole document's digest has
		// loaded it.
		Expect(k8sClient.Create(ctx, loadCurrent(ns, "a"))).To(Succeed())
		Eventually(func(g Gomega) { g.Expect(proxyStatus(g, ns).Enforced).To(Equal("1/1")) }, time.Minute).Should(Succeed())

		// A change of the last key's team changes its chunk and the tail (which holds
		// the generation) only: the chunks of the other keys keep their names. The
		// previous chunks stay until the next change, which deletes them.
		first := m.Chunks
		n := len(first)
		changeTeam := func(team string) {
			Eventually(func(g Gomega) {
				k := keyObject(g, ns, bulk.KeyName(keys-1))
				k.Spec.Team = team
				g.Expect(k8sClient.Update(ctx, k)).To(Succeed())
			}).Should(Succeed())
		}
		changeTeam("blue")
		var second []string
		Eventually(func(g Gomega) {
			m2 := manifestOf(g, ns)
			g.Expect(m2.Generation).To(Equal(m.Generation + 1))
			second = m2.Chunks
		}, time.Minute).Should(Succeed())
		Expect(second).To(HaveLen(n))
		Expect(second[:n-2]).To(Equal(first[:n-2]), "the chunks of the untouched keys keep their names")
		Expect(second[n-2]).NotTo(Equal(first[n-2]))
		Expect(second[n-1]).NotTo(Equal(first[n-1]))
		both := append(slices.Clone(second), first[n-2:]...)
		Expect(names(chunksOf(Default, ns))).To(ConsistOf(both))
		Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: "fleet-proxy"}, &role)).To(Succeed())
		Expect(role.Rules).To(ContainElement(HaveField("ResourceNames", ConsistOf(both))))

		changeTeam("green")
		var third []string
		Eventually(func(g Gomega) {
			m3 := manifestOf(g, ns)
			g.Expect(m3.Generation).To(Equal(m.Generation + 2))
			third = m3.Chunks
			g.Expect(third[:n-2]).To(Equal(first[:n-2]))
			g.Expect(names(chunksOf(g, ns))).To(ConsistOf(append(slices.Clone(third), second[n-2:]...)))
		}, time.Minute).Should(Succeed())

		// A config the proxy would refuse is not written, and the Role keeps naming the
		// chunks in force.
		Eventually(func(g Gomega) {
			var tp twv1alpha1.TokenProxy
			g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: "fleet"}, &tp)).To(Succeed())
			tp.Spec.Upstreams[1].URL = "http://vllm.models.svc:8000/v1?tenant=a"
			g.Expect(k8sClient.Update(ctx, &tp)).To(Succeed())
		}).Should(Succeed())
		Eventually(func(g Gomega) {
			g.Expect(condition(proxyStatus(g, ns).Conditions, twv1alpha1.ConditionAccepted).Reason).To(Equal(twv1alpha1.ReasonInvalidConfig))
		}, time.Minute).Should(Succeed())
		Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: "fleet-proxy"}, &role)).To(Succeed())
		Expect(role.Rules).To(ContainElement(HaveField("ResourceNames", ConsistOf(append(slices.Clone(third), second[n-2:]...)))))
		Expect(manifestOf(Default, ns).Chunks).To(Equal(third))
		GinkgoWriter.Printf("done in %s\n", time.Since(start))
	})
})
