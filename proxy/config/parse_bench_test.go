// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package config_test

import (
	"testing"

	"github.com/tokenwarden/tokenwarden/proxy/config"
)

// benchKeys is the size of a large fleet (issue 14): 50,000 keys.
const benchKeys = 50000

// BenchmarkParse50kYAML parses a standalone YAML document of 50,000 keys: the general
// path, through sigs.k8s.io/yaml.
func BenchmarkParse50kYAML(b *testing.B) {
	benchmarkParse(b, largeDocument(benchKeys))
}

// BenchmarkParse50kRendered parses the document of 50,000 keys in the form the
// operator renders a document too large for one ConfigMap.
func BenchmarkParse50kRendered(b *testing.B) {
	c, err := config.Parse(largeDocument(benchKeys))
	if err != nil {
		b.Fatal(err)
	}
	doc, err := c.Render()
	if err != nil {
		b.Fatal(err)
	}
	benchmarkParse(b, doc)
}

func benchmarkParse(b *testing.B, doc []byte) {
	b.SetBytes(int64(len(doc)))
	b.ReportAllocs()
	for b.Loop() {
		c, err := config.Parse(doc)
		if err != nil {
			b.Fatal(err)
		}
		if len(c.APIKeys) != benchKeys {
			b.Fatalf("%d keys", len(c.APIKeys))
		}
	}
}
