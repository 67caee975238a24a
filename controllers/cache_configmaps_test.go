// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package controllers_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/tokenwarden/tokenwarden/controllers"
	"github.com/tokenwarden/tokenwarden/proxy/config"
)

// The operator's cache holds of a config chunk only its text's hash: a 50,000-key
// fleet's chunks are its whole document and the previous one's.
var _ = Describe("The operator's cache of a fleet's config chunks", func() {
	const keys = 1500 // over 1 MiB: chunked

	It("holds each chunk's hash, not its text, at every start, and a chunk or the fleet's ConfigMap deleted by hand is written again", func() {
		ns := newNamespace("cached-chunks")
		manifest, m := chunkedFleet(ns, keys)
		Expect(len(m.Chunks)).To(BeNumerically(">", 1))
		texts := map[string]string{}
		for _, name := range m.Chunks {
			var cm corev1.ConfigMap
			Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &cm)).To(Succeed())
			texts[name] = cm.Data[config.ChunkKey]
		}
		holdsHashes := func(g Gomega, r client.Reader) {
			for name, text := range texts {
				var cm corev1.ConfigMap
				g.Expect(r.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &cm)).To(Succeed())
				sum := sha256.Sum256([]byte(text))
				g.Expect(cm.Data).To(Equal(map[string]string{config.ChunkKey: hex.EncodeToString(sum[:])}),
					"the cache holds chunk %s as its hash, not its %d bytes", name, len(text))
			}
		}

		By("the manager's cache")
		Eventually(func(g Gomega) { holdsHashes(g, mgrClient) }).Should(Succeed())

		By("a cache of the manager's options, at each of several starts")
		for range 8 {
			opts := controllers.CacheOptions()
			opts.Scheme = scheme
			c, err := cache.New(cfg, opts)
			Expect(err).NotTo(HaveOccurred())
			cctx, stop := context.WithCancel(ctx)
			go func() {
				defer GinkgoRecover()
				Expect(c.Start(cctx)).To(Succeed())
			}()
			Expect(c.WaitForCacheSync(cctx)).To(BeTrue())
			Eventually(func(g Gomega) { holdsHashes(g, c) }).Should(Succeed())
			stop()
		}

		By("a chunk deleted by hand")
		gone := m.Chunks[0]
		Expect(k8sClient.Delete(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: gone}})).To(Succeed())
		Eventually(func(g Gomega) {
			var cm corev1.ConfigMap
			g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: gone}, &cm)).To(Succeed())
			g.Expect(cm.DeletionTimestamp).To(BeNil())
			g.Expect(cm.Data).To(Equal(map[string]string{config.ChunkKey: texts[gone]}))
			g.Expect(manifest(g).Digest).To(Equal(m.Digest))
		}, time.Minute).Should(Succeed())

		By("the fleet's ConfigMap deleted by hand")
		Expect(k8sClient.Delete(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "fleet-proxy"}})).To(Succeed())
		Eventually(func(g Gomega) {
			g.Expect(rendered(g, ns).APIKeys).To(HaveLen(keys))
		}, time.Minute).Should(Succeed())
	})
})
