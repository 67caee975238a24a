// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package source_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/tokenwarden/tokenwarden/proxy/source"
)

func TestSource(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "Config Source Suite")
}

type recorder struct {
	mu   sync.Mutex
	docs []string
}

func (r *recorder) apply(data []byte, _ string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.docs = append(r.docs, string(data))
	return nil
}

func (r *recorder) last() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.docs) == 0 {
		return ""
	}
	return r.docs[len(r.docs)-1]
}

func (r *recorder) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.docs)
}

// all is every document delivered, in order.
func (r *recorder) all() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.docs...)
}

// doc is a config document of generation n.
func doc(n int) string {
	return fmt.Sprintf("generation: %d\nupstreams:\n- {name: default, url: \"http://127.0.0.1:8000\"}\n", n)
}

// run loads path the way the proxy does and watches it with a long resync, so only
// events deliver changes.
func run(path string) *recorder {
	return runFile(&source.File{Path: path, Resync: time.Hour})
}

func runFile(f *source.File) *recorder {
	rec := &recorder{}
	ctx, cancel := context.WithCancel(context.Background())
	DeferCleanup(cancel)
	_, err := f.Load(ctx)
	Expect(err).NotTo(HaveOccurred())
	go func() { _ = f.Run(ctx, rec.apply) }()
	time.Sleep(50 * time.Millisecond) // let the watch start, so the writes come as events
	return rec
}

// writeSlowly rewrites path in place the way a config tool may: truncated, then
// written in two parts, each after a pause longer than the watch waits for events.
func writeSlowly(path, data string) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_TRUNC, 0)
	Expect(err).NotTo(HaveOccurred())
	defer func() { Expect(f.Close()).To(Succeed()) }()
	for _, part := range []string{data[:len(data)/2], data[len(data)/2:]} {
		time.Sleep(100 * time.Millisecond)
		_, err := f.WriteString(part)
		Expect(err).NotTo(HaveOccurred())
	}
}

var _ = Describe("File", func() {
	var dir string
	BeforeEach(func() { dir = GinkgoT().TempDir() })

	It("loads the file", func() {
		path := filepath.Join(dir, "proxy.yaml")
		Expect(os.WriteFile(path, []byte(doc(1)), 0o644)).To(Succeed())
		data, err := (&source.File{Path: path}).Load(context.Background())
		Expect(err).NotTo(HaveOccurred())
		Expect(string(data)).To(Equal(doc(1)))
	})

	It("delivers a change written in place", func() {
		path := filepath.Join(dir, "proxy.yaml")
		Expect(os.WriteFile(path, []byte(doc(1)), 0o644)).To(Succeed())
		rec := run(path)
		Expect(os.WriteFile(path, []byte(doc(2)), 0o644)).To(Succeed())
		Eventually(rec.last, 10*time.Second).Should(Equal(doc(2)))
	})

	It("delivers an atomic replace by rename", func() {
		path := filepath.Join(dir, "proxy.yaml")
		Expect(os.WriteFile(path, []byte(doc(1)), 0o644)).To(Succeed())
		rec := run(path)
		tmp := filepath.Join(dir, ".proxy.yaml.tmp")
		Expect(os.WriteFile(tmp, []byte(doc(2)), 0o644)).To(Succeed())
		Expect(os.Rename(tmp, path)).To(Succeed())
		Eventually(rec.last, 10*time.Second).Should(Equal(doc(2)))
	})

	It("delivers a symlink swap the way a mounted ConfigMap changes", func() {
		// dir/config.yaml -> ..data/config.yaml, ..data -> ..v1, swapped to ..v2.
		for i, v := range []string{"v1", "v2"} {
			Expect(os.MkdirAll(filepath.Join(dir, ".."+v), 0o755)).To(Succeed())
			Expect(os.WriteFile(filepath.Join(dir, ".."+v, "config.yaml"), []byte(doc(i+1)), 0o644)).To(Succeed())
		}
		Expect(os.Symlink("..v1", filepath.Join(dir, "..data"))).To(Succeed())
		Expect(os.Symlink("..data/config.yaml", filepath.Join(dir, "config.yaml"))).To(Succeed())
		rec := run(filepath.Join(dir, "config.yaml"))

		Expect(os.Symlink("..v2", filepath.Join(dir, "..data_tmp"))).To(Succeed())
		Expect(os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data"))).To(Succeed())
		Eventually(rec.last, 10*time.Second).Should(Equal(doc(2)))
	})

	It("delivers a change made between Load and the watch", func() {
		path := filepath.Join(dir, "proxy.yaml")
		Expect(os.WriteFile(path, []byte(doc(1)), 0o644)).To(Succeed())
		f := &source.File{Path: path, Resync: time.Hour}
		data, err := f.Load(context.Background())
		Expect(err).NotTo(HaveOccurred())
		Expect(string(data)).To(Equal(doc(1)))
		Expect(os.WriteFile(path, []byte(doc(2)), 0o644)).To(Succeed())
		rec := &recorder{}
		ctx, cancel := context.WithCancel(context.Background())
		DeferCleanup(cancel)
		go func() { _ = f.Run(ctx, rec.apply) }()
		Eventually(rec.last, 10*time.Second).Should(Equal(doc(2)))
	})

	It("does not deliver the same document twice", func() {
		path := filepath.Join(dir, "proxy.yaml")
		Expect(os.WriteFile(path, []byte(doc(1)), 0o644)).To(Succeed())
		rec := run(path)
		Expect(os.WriteFile(path, []byte(doc(1)), 0o644)).To(Succeed())
		Expect(os.WriteFile(path, []byte(doc(2)), 0o644)).To(Succeed())
		Eventually(rec.last, 10*time.Second).Should(Equal(doc(2)))
		Consistently(rec.all, 200*time.Millisecond).Should(Equal([]string{doc(2)}))
	})

	It("delivers a document rewritten in place by a slow writer once, whole", func() {
		path := filepath.Join(dir, "proxy.yaml")
		Expect(os.WriteFile(path, []byte(doc(1)), 0o644)).To(Succeed())
		rec := run(path)
		writeSlowly(path, doc(2))
		Eventually(rec.last, 10*time.Second).Should(Equal(doc(2)))
		Consistently(rec.all, 200*time.Millisecond).Should(Equal([]string{doc(2)}))
	})

	It("delivers nothing when a slow writer writes the document in force again", func() {
		path := filepath.Join(dir, "proxy.yaml")
		Expect(os.WriteFile(path, []byte(doc(1)), 0o644)).To(Succeed())
		rec := run(path)
		writeSlowly(path, doc(1))
		Consistently(rec.all, 300*time.Millisecond).Should(BeEmpty())
	})

	It("delivers a document that does not parse once it has stayed the same, once", func() {
		path := filepath.Join(dir, "proxy.yaml")
		Expect(os.WriteFile(path, []byte(doc(1)), 0o644)).To(Succeed())
		rec := runFile(&source.File{Path: path, Resync: time.Hour, Settle: 200 * time.Millisecond})
		Expect(os.WriteFile(path, []byte("upstreams: ["), 0o644)).To(Succeed())
		Eventually(rec.all, 10*time.Second).Should(Equal([]string{"upstreams: ["}))
		Consistently(rec.count, 400*time.Millisecond).Should(Equal(1))
	})
})
