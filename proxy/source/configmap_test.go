// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package source_test

import (
	"context"
	"fmt"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/tokenwarden/tokenwarden/proxy/config"
	"github.com/tokenwarden/tokenwarden/proxy/source"
)

const ns = "fleet-ns"

// bigDocument is a document of n keys of about 130 bytes each.
func bigDocument(generation, n int) []byte {
	var b strings.Builder
	fmt.Fprintf(&b, "generation: %d\nupstreams:\n- {name: default, url: \"http://127.0.0.1:8000\"}\napi_keys:\n", generation)
	for i := range n {
		fmt.Fprintf(&b, "- {name: key-%06d, key_sha256: %064x, user: user-%d, team: team-%d}\n", i, i, i, i%7)
	}
	return []byte(b.String())
}

func manifestMap(m *config.Manifest) *corev1.ConfigMap {
	b, err := m.Marshal()
	Expect(err).NotTo(HaveOccurred())
	return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "fleet-proxy", Namespace: ns},
		Data: map[string]string{config.ManifestKey: string(b)}}
}

func chunkMap(c config.Chunk) *corev1.ConfigMap {
	return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: c.Name, Namespace: ns},
		Data: map[string]string{config.ChunkKey: string(c.Data)}, Immutable: ptrTo(true)}
}

func ptrTo[T any](v T) *T { return &v }

var _ = Describe("ConfigMap", func() {
	var (
		ctx    context.Context
		cs     *fake.Clientset
		src    *source.ConfigMap
		doc    []byte
		chunks []config.Chunk
		m      *config.Manifest
	)
	BeforeEach(func() {
		var cancel context.CancelFunc
		ctx, cancel = context.WithCancel(context.Background())
		DeferCleanup(cancel)
		cs = fake.NewClientset()
		src = &source.ConfigMap{Client: cs, Namespace: ns, Name: "fleet-proxy", Key: "proxy.yaml", Retry: 20 * time.Millisecond}
		doc = bigDocument(3, 10000) // about 1.3 MB: two chunks
		chunks, m = config.Split(doc, 3, "fleet-proxy", config.MaxInline)
		Expect(len(doc)).To(BeNumerically(">", 1<<20))
		Expect(chunks).To(HaveLen(2))
	})
	create := func(cm *corev1.ConfigMap) {
		_, err := cs.CoreV1().ConfigMaps(ns).Create(ctx, cm, metav1.CreateOptions{})
		Expect(err).NotTo(HaveOccurred())
	}
	// run starts the source and returns once its watch is open.
	run := func() *recorder {
		rec := &recorder{}
		go func() { _ = src.Run(ctx, rec.apply) }()
		Eventually(func() bool {
			for _, a := range cs.Actions() {
				if a.GetVerb() == "watch" {
					return true
				}
			}
			return false
		}).Should(BeTrue())
		return rec
	}

	It("applies a manifest's document only when it holds every chunk, never half of it", func() {
		create(manifestMap(m)) // the manifest before its chunks
		rec := run()
		Consistently(rec.count, 200*time.Millisecond).Should(BeZero())
		create(chunkMap(chunks[0]))
		Consistently(rec.count, 200*time.Millisecond).Should(BeZero())
		create(chunkMap(chunks[1]))
		Eventually(rec.last).Should(Equal(string(doc)))
		Consistently(rec.count, 200*time.Millisecond).Should(Equal(1))
	})

	It("waits on a chunk whose content is not its name's, and follows a newer version", func() {
		create(manifestMap(m))
		create(chunkMap(chunks[0]))
		forged := chunkMap(config.Chunk{Name: chunks[1].Name, Data: []byte("api_keys: []\n")})
		create(forged)
		rec := run()
		Consistently(rec.count, 200*time.Millisecond).Should(BeZero())

		// The operator renders generation 4 inline: the worker drops the manifest it
		// waits on and applies the newer document.
		small := "generation: 4\nupstreams:\n- {name: default, url: \"http://127.0.0.1:8000\"}\n"
		_, err := cs.CoreV1().ConfigMaps(ns).Update(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "fleet-proxy", Namespace: ns},
			Data: map[string]string{"proxy.yaml": small}}, metav1.UpdateOptions{})
		Expect(err).NotTo(HaveOccurred())
		Eventually(rec.last).Should(Equal(small))
		Consistently(rec.count, 200*time.Millisecond).Should(Equal(1))
	})

	It("loads a manifest's document at start, waiting for a chunk that is not there yet", func() {
		create(manifestMap(m))
		create(chunkMap(chunks[1]))
		loaded := make(chan []byte, 1)
		go func() {
			defer GinkgoRecover()
			d, err := src.Load(ctx)
			Expect(err).NotTo(HaveOccurred())
			loaded <- d
		}()
		Consistently(loaded, 200*time.Millisecond).ShouldNot(Receive())
		create(chunkMap(chunks[0]))
		Eventually(loaded).Should(Receive(Equal(doc)))

		// Run does not apply the document Load returned again.
		rec := run()
		Consistently(rec.count, 200*time.Millisecond).Should(BeZero())
	})

	It("still applies a document kept whole in the ConfigMap", func() {
		small := "generation: 1\nupstreams:\n- {name: default, url: \"http://127.0.0.1:8000\"}\n"
		create(&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "fleet-proxy", Namespace: ns}, Data: map[string]string{"proxy.yaml": small}})
		rec := run()
		Eventually(rec.last).Should(Equal(small))
	})
})
