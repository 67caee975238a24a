// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package server_test

import (
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
)

// BenchmarkHandlerTokenizer is BenchmarkHandler's request, and the 4 KB chat request,
// with gpt-4o estimated and with gpt-4o counted by o200k_base: the whole request's
// cost of a tokenizer model. "again" sends the same body every time (a conversation's
// history and an agent's tools, counted before); "new" makes the text of every message
// of every request new, so that all of it is tokenized.
func BenchmarkHandlerTokenizer(b *testing.B) {
	backend := benchBackend()
	defer backend.Close()
	models := map[string]string{
		"estimate":        "",
		"o200kBase/again": "models: [{name: gpt-4o, tokenizer: o200k_base}]\n",
		"o200kBase/new":   "models: [{name: gpt-4o, tokenizer: o200k_base}]\n",
	}
	bodies := map[string]string{"small": benchRequest, "4KB": string(chatBody4K)}
	var seq atomic.Int64
	for _, body := range []string{"small", "4KB"} {
		for _, mode := range []string{"estimate", "o200kBase/again", "o200kBase/new"} {
			b.Run(body+"/"+mode, func(b *testing.B) {
				srv := newBenchServerDoc(b, backend.URL, benchDoc+models[mode])
				parts := strings.Split(bodies[body], `"content":"`)
				b.SetBytes(int64(len(bodies[body])))
				b.ReportAllocs()
				b.ResetTimer()
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						text := bodies[body]
						if mode == "o200kBase/new" {
							// Each message's text starts with a number no request used.
							var sb strings.Builder
							sb.WriteString(parts[0])
							for _, p := range parts[1:] {
								sb.WriteString(`"content":"`)
								sb.WriteString(strconv.FormatInt(seq.Add(1), 10))
								sb.WriteString(" ")
								sb.WriteString(p)
							}
							text = sb.String()
						}
						req := httptest.NewRequest("POST", "/v1/chat/completions", strings.NewReader(text))
						req.Header.Set("Authorization", "Bearer sk-alice")
						w := httptest.NewRecorder()
						srv.ServeHTTP(w, req)
						if w.Code != 200 {
							b.Fatalf("status %d: %s", w.Code, w.Body)
						}
					}
				})
			})
		}
	}
}
