// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package server_test

import (
	"strings"
	"testing"
)

// BenchmarkHandlerAgentsCapped is BenchmarkHandlerAgents with the interactive class's
// output cap (100) below the request's max_tokens (256): every request's body is
// rewritten to the cap, and its estimate with it.
func BenchmarkHandlerAgentsCapped(b *testing.B) {
	backend := benchBackend()
	defer backend.Close()
	doc := strings.Replace(agentsBenchDoc, "max_output_tokens: 4096", "max_output_tokens: 100", 1)
	benchHandlerOn(b, newBenchServerDoc(b, backend.URL, doc), "X-Tokenwarden-Run-Id", "run-1")
}
