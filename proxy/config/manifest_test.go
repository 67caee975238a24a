// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package config_test

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"testing"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/tokenwarden/tokenwarden/proxy/config"
)

// largeDocument is a valid document of n keys, each line a SHA-256 in hex.
func largeDocument(n int) []byte {
	var b strings.Builder
	b.WriteString("generation: 7\nupstreams:\n- {name: default, url: \"http://127.0.0.1:8000\"}\napi_keys:\n")
	for i := range n {
		sum := sha256.Sum256([]byte(fmt.Sprint(i)))
		fmt.Fprintf(&b, "- {name: key-%d, key_sha256: %s, user: user-%d, team: team-%d}\n", i, hex.EncodeToString(sum[:]), i, i%50)
	}
	return []byte(b.String())
}

var _ = Describe("Split and Assemble", func() {
	It("cuts 50,000 keys into chunks under the limit, at line breaks, and puts them back together", func() {
		doc := largeDocument(50000)
		Expect(len(doc)).To(BeNumerically(">", 5*config.MaxInline))
		_, err := config.Parse(doc)
		Expect(err).NotTo(HaveOccurred())

		chunks, m := config.Split(doc, 7, "fleet-proxy", config.MaxInline)
		Expect(len(chunks)).To(BeNumerically(">=", 6))
		Expect(m.Chunks).To(HaveLen(len(chunks)))
		Expect(m.Digest).To(Equal(config.Digest(doc)))
		Expect(m.Size).To(Equal(int64(len(doc))))
		byName := map[string][]byte{}
		for i, c := range chunks {
			Expect(len(c.Data)).To(BeNumerically("<=", config.MaxInline))
			Expect(c.Data[len(c.Data)-1]).To(Equal(byte('\n')))
			Expect(c.Name).To(Equal(m.Chunks[i]))
			Expect(c.Name).To(MatchRegexp(`^fleet-proxy-[0-9a-f]{16}$`))
			Expect(config.ChunkMatches(c.Name, c.Data)).To(BeTrue())
			Expect(config.ChunkMatches(c.Name, doc[:10])).To(BeFalse())
			byName[c.Name] = c.Data
		}

		// The manifest travels as YAML.
		b, err := m.Marshal()
		Expect(err).NotTo(HaveOccurred())
		m2, err := config.ParseManifest(b)
		Expect(err).NotTo(HaveOccurred())
		Expect(m2).To(Equal(m))

		got, err := m2.Assemble(func(name string) ([]byte, bool) { d, ok := byName[name]; return d, ok })
		Expect(err).NotTo(HaveOccurred())
		Expect(got).To(Equal(doc))
	})

	It("names equal content alike and changed content anew", func() {
		doc := largeDocument(20000)
		a, _ := config.Split(doc, 1, "p", config.MaxInline)
		b, _ := config.Split(doc, 1, "p", config.MaxInline)
		Expect(a).To(Equal(b))
		changed := append([]byte{}, doc...)
		changed[len(changed)-2] = 'x'
		c, _ := config.Split(changed, 1, "p", config.MaxInline)
		Expect(c[0].Name).To(Equal(a[0].Name))
		Expect(c[len(c)-1].Name).NotTo(Equal(a[len(a)-1].Name))
	})

	It("cuts a line longer than a chunk at a character boundary", func() {
		doc := []byte(strings.Repeat("é", 10)) // 2 bytes each
		chunks, m := config.Split(doc, 1, "p", 5)
		for _, c := range chunks {
			Expect(len(c.Data)).To(BeNumerically("<=", 5))
			Expect(string(c.Data)).To(MatchRegexp(`^(é)+$`))
		}
		got, err := m.Assemble(func(name string) ([]byte, bool) {
			for _, c := range chunks {
				if c.Name == name {
					return c.Data, true
				}
			}
			return nil, false
		})
		Expect(err).NotTo(HaveOccurred())
		Expect(got).To(Equal(doc))
	})

	It("refuses a missing chunk and a document that is not the manifest's", func() {
		doc := largeDocument(10000)
		chunks, m := config.Split(doc, 1, "p", 100<<10)
		Expect(len(chunks)).To(BeNumerically(">", 2))
		_, err := m.Assemble(func(name string) ([]byte, bool) {
			if name == chunks[1].Name {
				return nil, false
			}
			for _, c := range chunks {
				if c.Name == name {
					return c.Data, true
				}
			}
			return nil, false
		})
		Expect(err).To(MatchError(config.ErrChunkMissing))
		_, err = m.Assemble(func(name string) ([]byte, bool) { return chunks[0].Data, true })
		Expect(err).To(MatchError(ContainSubstring("not the manifest's")))
	})
})

// BenchmarkSplitAssemble50000 cuts and puts back the document of 50,000 keys
// (about 7 MB): the operator's and each proxy's share of a large fleet's reload.
func BenchmarkSplitAssemble50000(b *testing.B) {
	doc := largeDocument(50000)
	b.SetBytes(int64(len(doc)))
	b.ReportAllocs()
	for b.Loop() {
		chunks, m := config.Split(doc, 7, "fleet-proxy", config.MaxInline)
		byName := make(map[string][]byte, len(chunks))
		for _, c := range chunks {
			byName[c.Name] = c.Data
		}
		if _, err := m.Assemble(func(name string) ([]byte, bool) { d, ok := byName[name]; return d, ok }); err != nil {
			b.Fatal(err)
		}
	}
	chunks, _ := config.Split(doc, 7, "fleet-proxy", config.MaxInline)
	b.ReportMetric(float64(len(chunks)), "chunks")
	b.ReportMetric(float64(len(doc)), "doc-bytes")
}

// BenchmarkParse50000 parses the document of 50,000 keys, as each proxy does on a
// reload of a large fleet.
func BenchmarkParse50000(b *testing.B) {
	doc := largeDocument(50000)
	b.SetBytes(int64(len(doc)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := config.Parse(doc); err != nil {
			b.Fatal(err)
		}
	}
}
