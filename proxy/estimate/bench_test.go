// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package estimate_test

import (
	"testing"

	"github.com/tokenwarden/tokenwarden/proxy/estimate"
)

var chatBody = []byte(`{"model":"gpt-4o","max_tokens":256,"messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"Summarise the plot of a long novel in three sentences, please."}]}`)

func BenchmarkBody(b *testing.B) {
	b.ReportAllocs()
	b.SetBytes(int64(len(chatBody)))
	for b.Loop() {
		if e, _ := estimate.Body(chatBody); e.Total() == 0 {
			b.Fatal("no estimate")
		}
	}
}
