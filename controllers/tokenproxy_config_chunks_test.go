// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package controllers_test

import (
	"bytes"
	"encoding/json"
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

// A ConfigMap that takes the name of a config chunk before the operator writes it:
// the operator must neither hand it to the fleet nor overwrite it.
var _ = Describe("A ConfigMap in the way of a config chunk", func() {
	const keys = 1500 // over 1 MiB: chunked

	It("is neither used nor overwritten: Degraded=ConfigChunkTaken names it, the fleet keeps its config, and its removal heals", func() {
		ns := newNamespace("taken")
		manifest, m := chunkedFleet(ns, keys)

		// The next document: the last key in team blue. Its last chunk is predictable,
		// so a ConfigMap can take its name first.
		doc := document(Default, ns)
		var next config.Config
		Expect(json.Unmarshal(doc, &next)).To(Succeed())
		again, err := next.Render()
		Expect(err).NotTo(HaveOccurred())
		Expect(string(again)).To(Equal(string(doc)), "the document renders back to itself")
		next.Generation++
		next.APIKeys[len(next.APIKeys)-1].Team = "blue"
		nextDoc, err := next.Render()
		Expect(err).NotTo(HaveOccurred())
		// The last chunk is the tail: from the end of the keys' list on.
		end := bytes.Index(nextDoc, []byte("\n],\n"))
		Expect(end).To(BeNumerically(">", 0), "the end of the keys' list")
		tail := nextDoc[end:]
		taken := config.Chunk{Name: config.ChunkName("fleet-proxy", tail), Data: tail}
		Expect(m.Chunks).NotTo(ContainElement(taken.Name))
		forged := `{"api_keys":[{"name":"mallory","key_sha256":"` + sha("sk-mallory") + `"}],`
		squatter := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: taken.Name, Namespace: ns},
			Data: map[string]string{config.ChunkKey: forged}}
		Expect(k8sClient.Create(ctx, squatter)).To(Succeed())

		Eventually(func(g Gomega) {
			k := keyObject(g, ns, bulk.KeyName(keys-1))
			k.Spec.Team = "blue"
			g.Expect(k8sClient.Update(ctx, k)).To(Succeed())
		}).Should(Succeed())
		degraded := func(g Gomega, why string) {
			deg := condition(proxyStatus(g, ns).Conditions, twv1alpha1.ConditionDegraded)
			g.Expect(deg.Status).To(Equal(metav1.ConditionTrue))
			g.Expect(deg.Reason).To(Equal(twv1alpha1.ReasonConfigChunkTaken))
			g.Expect(deg.Message).To(ContainSubstring("ConfigMap " + ns + "/" + taken.Name))
			g.Expect(deg.Message).To(ContainSubstring(why))
		}
		Eventually(func(g Gomega) {
			degraded(g, "is not controlled by TokenProxy fleet and holds other content")
			g.Expect(warningReasons(g, ns)).To(ContainElement(twv1alpha1.ReasonConfigChunkTaken))
		}, time.Minute).Should(Succeed())
		unused := func() {
			GinkgoHelper()
			Expect(manifest(Default).Generation).To(Equal(m.Generation), "the fleet keeps its last config")
			Expect(manifest(Default).Chunks).To(Equal(m.Chunks))
			var role rbacv1.Role
			Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: "fleet-proxy"}, &role)).To(Succeed())
			for _, rule := range role.Rules {
				Expect(rule.ResourceNames).NotTo(ContainElement(taken.Name), "the pods may not read it")
			}
			var cm corev1.ConfigMap
			Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(squatter), &cm)).To(Succeed())
			Expect(cm.Data).To(Equal(map[string]string{config.ChunkKey: forged}), "not overwritten")
			Expect(cm.OwnerReferences).To(BeEmpty(), "not adopted")
		}
		unused()

		By("the same content as the chunk, but not the operator's: still not used")
		// Updated in place: deleted, its name would be free for the operator's retry.
		Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(squatter), squatter)).To(Succeed())
		forged = string(taken.Data)
		squatter.Data = map[string]string{config.ChunkKey: forged}
		Expect(k8sClient.Update(ctx, squatter)).To(Succeed())
		Eventually(func(g Gomega) {
			// Another change, so that the reconcile meets it again: of the first key,
			// in the first chunk, so that the last chunk is still the one taken (a
			// change of a key in the last chunk would give it another name, and the
			// fleet would rightly reconcile).
			k := keyObject(g, ns, bulk.KeyName(0))
			k.Spec.User = "someone"
			g.Expect(k8sClient.Update(ctx, k)).To(Succeed())
		}).Should(Succeed())
		Eventually(func(g Gomega) {
			deg := condition(proxyStatus(g, ns).Conditions, twv1alpha1.ConditionDegraded)
			g.Expect(deg.Reason).To(Equal(twv1alpha1.ReasonConfigChunkTaken))
			g.Expect(deg.Message).To(SatisfyAll(ContainSubstring("is not controlled by TokenProxy fleet"), Not(ContainSubstring("other content"))))
		}, time.Minute).Should(Succeed())
		unused()

		By("its removal")
		Expect(k8sClient.Delete(ctx, squatter)).To(Succeed())
		Eventually(func(g Gomega) {
			g.Expect(manifest(g).Generation).To(BeNumerically(">", m.Generation))
			g.Expect(condition(proxyStatus(g, ns).Conditions, twv1alpha1.ConditionDegraded).Status).To(Equal(metav1.ConditionFalse))
			c := rendered(g, ns)
			g.Expect(c.APIKeys[len(c.APIKeys)-1].Team).To(Equal("blue"))
		}, time.Minute).Should(Succeed())
	})
})

// chunkedFleet creates keys ApiKeys and a fleet of one in ns, waits until its config
// holds every key and it is not Degraded, and returns a reader of its manifest and the
// manifest then.
func chunkedFleet(ns string, keys int) (func(Gomega) *config.Manifest, *config.Manifest) {
	GinkgoHelper()
	Expect(bulk.CreateKeys(ctx, k8sClient, ns, "fleet", keys)).To(Succeed())
	Expect(k8sClient.Create(ctx, credentialSecret(ns, "provider", map[string]string{"anthropic": "upstream"}))).To(Succeed())
	Expect(k8sClient.Create(ctx, fleetProxy(ns, 1))).To(Succeed())
	manifest := func(g Gomega) *config.Manifest {
		var cm corev1.ConfigMap
		g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: "fleet-proxy"}, &cm)).To(Succeed())
		m, err := config.ParseManifest([]byte(cm.Data[config.ManifestKey]))
		g.Expect(err).NotTo(HaveOccurred())
		return m
	}
	var m *config.Manifest
	Eventually(func(g Gomega) {
		g.Expect(rendered(g, ns).APIKeys).To(HaveLen(keys))
		m = manifest(g)
		g.Expect(condition(proxyStatus(g, ns).Conditions, twv1alpha1.ConditionDegraded).Status).To(Equal(metav1.ConditionFalse))
	}, 2*time.Minute).Should(Succeed())
	return manifest, m
}
