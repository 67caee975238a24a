// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package server_test

import (
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
)

// registryDocBench is benchDoc with gpt-4o in the model registry: a context window,
// a largest output and two upstreams, so a request takes the pre-check, the choice of
// a healthy upstream and the health records on its answer.
var registryDocBench = strings.Replace(benchDoc, "upstreams: [{name: default, url: UPSTREAM}]",
	"upstreams: [{name: default, url: UPSTREAM, provider: openai}, {name: backup, url: UPSTREAM}]", 1) + `
models:
- name: gpt-4o
  context_window: 128000
  max_output_tokens: 16384
  upstreams: [{upstream: default}, {upstream: backup}]
`

// BenchmarkProxyRegistry compares, in one run over loopback HTTP at 64 connections, a
// bare reverse proxy, tokenwarden (memory store, every dimension) and the same with
// the model registry, so the registry's cost reads as a same-run ratio.
func BenchmarkProxyRegistry(b *testing.B) {
	backend := benchBackend()
	defer backend.Close()
	target, _ := url.Parse(backend.URL)
	b.Run("bare-reverseproxy", func(b *testing.B) {
		defer closeRow(backend)
		front := bareReverseProxy(target)
		defer front.Close()
		benchHTTP(b, front.URL, 32)
	})
	b.Run("tokenwarden-memory", func(b *testing.B) {
		defer closeRow(backend)
		front := httptest.NewServer(newBenchServer(b, backend.URL))
		defer front.Close()
		benchHTTP(b, front.URL, 32)
	})
	b.Run("tokenwarden-memory-registry", func(b *testing.B) {
		defer closeRow(backend)
		front := httptest.NewServer(newBenchServerDoc(b, backend.URL, registryDocBench))
		defer front.Close()
		benchHTTP(b, front.URL, 32)
	})
}

// BenchmarkHandlerRegistry is BenchmarkHandler with gpt-4o in the model registry.
func BenchmarkHandlerRegistry(b *testing.B) {
	backend := benchBackend()
	defer backend.Close()
	benchHandlerDoc(b, backend.URL, registryDocBench)
}

// BenchmarkHandlerRenamed is BenchmarkHandlerRegistry with gpt-4o renamed for its
// upstream (provider_model), so that every request's body is rewritten with the
// provider's name.
func BenchmarkHandlerRenamed(b *testing.B) {
	backend := benchBackend()
	defer backend.Close()
	doc := strings.Replace(registryDocBench, "upstreams: [{upstream: default}, {upstream: backup}]",
		"upstreams: [{upstream: default, provider_model: gpt-4o-2024-08-06}, {upstream: backup}]", 1)
	benchHandlerDoc(b, backend.URL, doc)
}
