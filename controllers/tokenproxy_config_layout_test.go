// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package controllers_test

import (
	"slices"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	twv1alpha1 "github.com/tokenwarden/tokenwarden/api/v1alpha1"
	"github.com/tokenwarden/tokenwarden/proxy/config"
	"github.com/tokenwarden/tokenwarden/test/bulk"
)

// A chunked fleet's document changes chunk by chunk (issue 14): a key added, changed,
// rotated or deleted is enforced, and the chunks of the keys around it keep their
// names, so a replica fetches only the chunks that changed.
var _ = Describe("A chunked fleet, one key at a time", func() {
	const keys = 1500 // about 1.2 MB: chunked

	It("enforces an added, a changed, a rotated and a deleted key, and renames only the chunks they are in", func() {
		ns := newNamespace("onekey")
		Expect(bulk.CreateKeys(ctx, k8sClient, ns, "fleet", keys)).To(Succeed())
		Expect(k8sClient.Create(ctx, credentialSecret(ns, "provider", map[string]string{"anthropic": "upstream"}))).To(Succeed())
		Expect(k8sClient.Create(ctx, fleetProxy(ns, 1))).To(Succeed())
		Eventually(func(g Gomega) { g.Expect(rendered(g, ns).APIKeys).To(HaveLen(keys)) }, 2*time.Minute).Should(Succeed())
		Expect(k8sClient.Create(ctx, loadCurrent(ns, "a"))).To(Succeed())

		chunkNames := func(g Gomega) (int64, []string) {
			var cm corev1.ConfigMap
			g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: "fleet-proxy"}, &cm)).To(Succeed())
			m, err := config.ParseManifest([]byte(cm.Data[config.ManifestKey]))
			g.Expect(err).NotTo(HaveOccurred())
			return m.Generation, m.Chunks
		}
		generation, before := chunkNames(Default)
		Expect(len(before)).To(BeNumerically(">=", 5), "1,500 keys of 800 bytes in chunks of about 128 KiB, and the tail")

		// inForce waits for the next document to hold the key as check wants it, has
		// the replica load that document, and waits for Enforced=True on the key and
		// the fleet. At most the key's chunk (split in two, or merged with the next,
		// when the key ends a chunk) and the tail are renamed.
		inForce := func(name string, check func(g Gomega, k *config.APIKey)) {
			GinkgoHelper()
			var after []string
			Eventually(func(g Gomega) {
				var at *config.APIKey
				c := rendered(g, ns)
				for i := range c.APIKeys {
					if c.APIKeys[i].Name == name {
						at = &c.APIKeys[i]
					}
				}
				check(g, at)
				var g2 int64
				g2, after = chunkNames(g)
				g.Expect(g2).To(BeNumerically(">", generation))
				generation = g2
			}, time.Minute).Should(Succeed())
			kept := 0
			for _, n := range after {
				if slices.Contains(before, n) {
					kept++
				}
			}
			Expect(len(after)-kept).To(BeNumerically("<=", 3), "new chunks")
			Expect(kept).To(BeNumerically(">=", len(before)-3), "chunks kept")
			before = after
			reportCurrent(ns, "a")
			Eventually(func(g Gomega) {
				st := proxyStatus(g, ns)
				g.Expect(st.ConfigGeneration).To(Equal(generation))
				g.Expect(st.Enforced).To(Equal("1/1"))
				if name != "" {
					g.Expect(enforcedOf(keyObject(g, ns, name).Status.Conditions).Status).To(Equal(metav1.ConditionTrue))
				}
			}, time.Minute).Should(Succeed())
		}

		// One more key, in the middle of the name order.
		added := "k00700-a"
		Expect(k8sClient.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "s-added", Namespace: ns,
			Labels: map[string]string{twv1alpha1.SecretUsageLabel: twv1alpha1.SecretUsageAPIKey}},
			StringData: map[string]string{"key": "sk-added"}})).To(Succeed())
		Expect(k8sClient.Create(ctx, &twv1alpha1.ApiKey{ObjectMeta: metav1.ObjectMeta{Name: added, Namespace: ns},
			Spec: twv1alpha1.ApiKeySpec{ProxyRef: twv1alpha1.ProxyReference{Name: "fleet"},
				SecretRef: twv1alpha1.SecretKeyReference{Name: "s-added"}, RequestsPerSecond: 5}})).To(Succeed())
		inForce(added, func(g Gomega, k *config.APIKey) {
			g.Expect(k).NotTo(BeNil())
			g.Expect(k.KeySHA256).To(Equal(sha("sk-added")))
			g.Expect(k.RateLimit).To(Equal(int64(5)))
		})

		// Its limits changed.
		Eventually(func(g Gomega) {
			k := keyObject(g, ns, added)
			k.Spec.RequestsPerSecond = 9
			g.Expect(k8sClient.Update(ctx, k)).To(Succeed())
		}).Should(Succeed())
		inForce(added, func(g Gomega, k *config.APIKey) {
			g.Expect(k).NotTo(BeNil())
			g.Expect(k.RateLimit).To(Equal(int64(9)))
		})

		// Its Secret rotated: the new key's hash, the old one's gone.
		Eventually(func(g Gomega) {
			var s corev1.Secret
			g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: "s-added"}, &s)).To(Succeed())
			s.Data = map[string][]byte{"key": []byte("sk-rotated")}
			g.Expect(k8sClient.Update(ctx, &s)).To(Succeed())
		}).Should(Succeed())
		inForce(added, func(g Gomega, k *config.APIKey) {
			g.Expect(k).NotTo(BeNil())
			g.Expect(k.KeySHA256).To(Equal(sha("sk-rotated")))
		})

		// Another key deleted.
		gone := bulk.KeyName(1200)
		Expect(k8sClient.Delete(ctx, keyObject(Default, ns, gone))).To(Succeed())
		inForce("", func(g Gomega, _ *config.APIKey) {
			names := []string{}
			for _, k := range rendered(g, ns).APIKeys {
				names = append(names, k.Name)
			}
			g.Expect(names).NotTo(ContainElement(gone))
			g.Expect(names).To(HaveLen(keys))
		})
	})
})
