// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package source_test

import (
	"context"
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

// run starts a file source on path with a long resync, so only events deliver changes.
func run(path string) *recorder {
	rec := &recorder{}
	ctx, cancel := context.WithCancel(context.Background())
	DeferCleanup(cancel)
	f := &source.File{Path: path, Resync: time.Hour}
	go func() { _ = f.Run(ctx, rec.apply) }()
	time.Sleep(50 * time.Millisecond) // let the watch start
	return rec
}

var _ = Describe("File", func() {
	var dir string
	BeforeEach(func() { dir = GinkgoT().TempDir() })

	It("loads the file", func() {
		path := filepath.Join(dir, "proxy.yaml")
		Expect(os.WriteFile(path, []byte("v1"), 0o644)).To(Succeed())
		data, err := (&source.File{Path: path}).Load(context.Background())
		Expect(err).NotTo(HaveOccurred())
		Expect(string(data)).To(Equal("v1"))
	})

	It("delivers a change written in place", func() {
		path := filepath.Join(dir, "proxy.yaml")
		Expect(os.WriteFile(path, []byte("v1"), 0o644)).To(Succeed())
		rec := run(path)
		Expect(os.WriteFile(path, []byte("v2"), 0o644)).To(Succeed())
		Eventually(rec.last, 2*time.Second).Should(Equal("v2"))
	})

	It("delivers an atomic replace by rename", func() {
		path := filepath.Join(dir, "proxy.yaml")
		Expect(os.WriteFile(path, []byte("v1"), 0o644)).To(Succeed())
		rec := run(path)
		tmp := filepath.Join(dir, ".proxy.yaml.tmp")
		Expect(os.WriteFile(tmp, []byte("v2"), 0o644)).To(Succeed())
		Expect(os.Rename(tmp, path)).To(Succeed())
		Eventually(rec.last, 2*time.Second).Should(Equal("v2"))
	})

	It("delivers a symlink swap the way a mounted ConfigMap changes", func() {
		// dir/config.yaml -> ..data/config.yaml, ..data -> ..v1, swapped to ..v2.
		for _, v := range []string{"v1", "v2"} {
			Expect(os.MkdirAll(filepath.Join(dir, ".."+v), 0o755)).To(Succeed())
			Expect(os.WriteFile(filepath.Join(dir, ".."+v, "config.yaml"), []byte(v), 0o644)).To(Succeed())
		}
		Expect(os.Symlink("..v1", filepath.Join(dir, "..data"))).To(Succeed())
		Expect(os.Symlink("..data/config.yaml", filepath.Join(dir, "config.yaml"))).To(Succeed())
		rec := run(filepath.Join(dir, "config.yaml"))

		Expect(os.Symlink("..v2", filepath.Join(dir, "..data_tmp"))).To(Succeed())
		Expect(os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data"))).To(Succeed())
		Eventually(rec.last, 2*time.Second).Should(Equal("v2"))
	})

	It("delivers a change made between Load and the watch", func() {
		path := filepath.Join(dir, "proxy.yaml")
		Expect(os.WriteFile(path, []byte("v1"), 0o644)).To(Succeed())
		f := &source.File{Path: path, Resync: time.Hour}
		data, err := f.Load(context.Background())
		Expect(err).NotTo(HaveOccurred())
		Expect(string(data)).To(Equal("v1"))
		Expect(os.WriteFile(path, []byte("v2"), 0o644)).To(Succeed())
		rec := &recorder{}
		ctx, cancel := context.WithCancel(context.Background())
		DeferCleanup(cancel)
		go func() { _ = f.Run(ctx, rec.apply) }()
		Eventually(rec.last, 2*time.Second).Should(Equal("v2"))
	})

	It("does not deliver the same document twice", func() {
		path := filepath.Join(dir, "proxy.yaml")
		Expect(os.WriteFile(path, []byte("v1"), 0o644)).To(Succeed())
		rec := run(path)
		Expect(os.WriteFile(path, []byte("v1"), 0o644)).To(Succeed())
		Expect(os.WriteFile(path, []byte("v2"), 0o644)).To(Succeed())
		Eventually(rec.last, 2*time.Second).Should(Equal("v2"))
		Consistently(rec.count, 200*time.Millisecond).Should(Equal(1))
	})
})
