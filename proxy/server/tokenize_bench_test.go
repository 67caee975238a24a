// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package server_test

import (
	"net/http/httptest"
	"strings"
	"testing"
)

// BenchmarkHandlerTokenizer is BenchmarkHandler's request, and the 4 KB chat request,
// with gpt-4o estimated and with gpt-4o counted by o200k_base: the whole request's
// cost of a tokenizer model.
func BenchmarkHandlerTokenizer(b *testing.B) {
	backend := benchBackend()
	defer backend.Close()
	models := map[string]string{
		"estimate":  "",
		"o200kBase": "models: [{name: gpt-4o, tokenizer: o200k_base}]\n",
	}
	bodies := map[string]string{"small": benchRequest, "4KB": string(chatBody4K)}
	for _, body := range []string{"small", "4KB"} {
		for _, mode := range []string{"estimate", "o200kBase"} {
			b.Run(body+"/"+mode, func(b *testing.B) {
				srv := newBenchServerDoc(b, backend.URL, benchDoc+models[mode])
				b.SetBytes(int64(len(bodies[body])))
				b.ReportAllocs()
				b.ResetTimer()
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						req := httptest.NewRequest("POST", "/v1/chat/completions", strings.NewReader(bodies[body]))
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
