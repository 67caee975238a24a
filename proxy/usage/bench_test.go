// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package usage_test

import (
	"strings"
	"testing"

	"github.com/tokenwarden/tokenwarden/proxy/usage"
)

// chatBody is a typical non-streamed chat completion.
var chatBody = []byte(`{"id":"chatcmpl-AbC123","object":"chat.completion","created":1730000000,"model":"gpt-4o-2024-08-06",` +
	`"choices":[{"index":0,"message":{"role":"assistant","content":"` + strings.Repeat("The quick brown fox jumps over the lazy dog. ", 12) +
	`","refusal":null},"logprobs":null,"finish_reason":"stop"}],` +
	`"usage":{"prompt_tokens":120,"completion_tokens":130,"total_tokens":250,"prompt_tokens_details":{"cached_tokens":0},"completion_tokens_details":{"reasoning_tokens":0}},` +
	`"system_fingerprint":"fp_123"}`)

// bigBody is a 1 MiB chat completion.
var bigBody = []byte(`{"id":"x","choices":[{"index":0,"message":{"role":"assistant","content":"` + strings.Repeat("lorem ipsum ", 1<<20/12) +
	`"}}],"usage":{"prompt_tokens":10,"completion_tokens":262144}}`)

// chatStream is a streamed chat completion of 100 deltas with include_usage.
var chatStream = func() []byte {
	var sb strings.Builder
	for i := 0; i < 100; i++ {
		sb.WriteString(`data: {"id":"chatcmpl-AbC123","object":"chat.completion.chunk","created":1730000000,"model":"gpt-4o-2024-08-06","system_fingerprint":"fp_123","choices":[{"index":0,"delta":{"content":" word"},"logprobs":null,"finish_reason":null}]}` + "\n\n")
	}
	sb.WriteString(`data: {"id":"chatcmpl-AbC123","object":"chat.completion.chunk","created":1730000000,"model":"gpt-4o","choices":[],"usage":{"prompt_tokens":20,"completion_tokens":100,"total_tokens":120}}` + "\n\n")
	sb.WriteString("data: [DONE]\n\n")
	return []byte(sb.String())
}()

func BenchmarkFromJSON(b *testing.B) {
	for _, c := range []struct {
		name string
		body []byte
	}{{"chat", chatBody}, {"1MiB", bigBody}} {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(len(c.body)))
			b.ReportAllocs()
			for b.Loop() {
				if !usage.FromJSON(c.body).Found {
					b.Fatal("no usage")
				}
			}
		})
	}
}

// BenchmarkStream feeds a 100-delta stream in 4 KiB writes, as the reverse proxy's
// copy loop would.
func BenchmarkStream(b *testing.B) {
	b.SetBytes(int64(len(chatStream)))
	b.ReportAllocs()
	for b.Loop() {
		s := &usage.Stream{}
		for p := chatStream; len(p) > 0; {
			n := min(4096, len(p))
			_, _ = s.Write(p[:n])
			p = p[n:]
		}
		if !s.Ended() || !s.Usage().Found {
			b.Fatal("no usage")
		}
	}
}
