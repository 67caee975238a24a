// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package server_test

import (
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
)

// agentsBenchDoc is benchDoc with an upstream capacity it never reaches, a class
// output cap above the request's, and every limit for agents on the key.
var agentsBenchDoc = strings.Replace(strings.Replace(benchDoc,
	"url: UPSTREAM}", "url: UPSTREAM, capacity: {max_in_flight_requests: 100000, max_in_flight_tokens: 1000000000}}", 1),
	"team: research}", "team: research, max_in_flight: 100000, run_token_budget: 1000000000000000, run_max_steps: 1000000000000}\n"+
		"scheduling: {classes: {interactive: {max_output_tokens: 4096}}}", 1)

// BenchmarkProxyScheduled compares in one run, over loopback HTTP at 64 connections, a
// bare httputil.ReverseProxy, the proxy without a capacity, and the proxy with a
// capacity it never reaches and every limit for agents, each request in the same run:
// what the scheduler and the limits cost below capacity.
func BenchmarkProxyScheduled(b *testing.B) {
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
		// The same run id header, which this fleet ignores: the comparison is of the work.
		benchHTTP(b, front.URL, 32, "X-Tokenwarden-Run-Id", "run-1")
	})
	b.Run("tokenwarden-memory-scheduled-agents", func(b *testing.B) {
		defer closeRow(backend)
		front := httptest.NewServer(newBenchServerDoc(b, backend.URL, agentsBenchDoc))
		defer front.Close()
		benchHTTP(b, front.URL, 32, "X-Tokenwarden-Run-Id", "run-1")
	})
}

// BenchmarkHandlerAgents is BenchmarkHandlerScheduled with every limit for agents on
// the key and a run id on each request.
func BenchmarkHandlerAgents(b *testing.B) {
	backend := benchBackend()
	defer backend.Close()
	benchHandlerOn(b, newBenchServerDoc(b, backend.URL, agentsBenchDoc), "X-Tokenwarden-Run-Id", "run-1")
}
