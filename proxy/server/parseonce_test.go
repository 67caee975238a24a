// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package server_test

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/proxy/metrics"
	"github.com/tokenwarden/tokenwarden/proxy/server"
)

// parseOnceDoc names a tokenizer for the OpenAI model (no encoding counts an Anthropic
// model's tokens), renames each model for its upstream, and turns the response cache
// on, so that a request passes every stage that reads its body.
const parseOnceDoc = `
upstreams:
- {name: openai, url: UPSTREAM}
- {name: claude, url: UPSTREAM, provider: anthropic}
models:
- name: gpt-4o
  tokenizer: o200k_base
  upstreams: [{upstream: openai, provider_model: gpt-4o-2024-08-06}]
- name: sonnet
  upstreams: [{upstream: claude, provider_model: claude-sonnet-4-5}]
api_keys:
- {name: alice, key_sha256: HASH}
rate_limiting:
  budget_division: {replicas: 1}
  limits:
    per_api_key: {tokens_per_minute: 1000000000000}
cache: {storage: memory}
`

// parseOnceText is every string of parseOnceBody: long enough that the tokenizer
// remembers its count, so that only reading the body costs allocations.
var parseOnceText = strings.Repeat("the same words of every message ", 10)

// parseOnceBody is a request of the route with n messages (or prompts, or input items)
// and n more top-level members.
func parseOnceBody(route, model string, n int) string {
	var items, extra strings.Builder
	for i := range n {
		if i > 0 {
			items.WriteByte(',')
		}
		switch route {
		case "/v1/completions":
			fmt.Fprintf(&items, `%q`, parseOnceText)
		default:
			// A model inside a message is text, never renamed.
			fmt.Fprintf(&items, `{"content":%q,"model":%q}`, parseOnceText, parseOnceText)
		}
		fmt.Fprintf(&extra, `,"x_%d":{"n":%d}`, i, i)
	}
	field := map[string]string{"/v1/completions": "prompt", "/v1/responses": "input"}[route]
	if field == "" {
		field = "messages"
	}
	// The model is escaped: the rename replaces it as the upstream decodes it.
	return fmt.Sprintf(`{"mod\u0065l":%q,"max_tokens":64,%q:[%s]%s}`, model, field, items.String(), extra.String())
}

// TestEveryStageReadsTheOneScan: on every charged route, with the body plain or
// gzipped, a request whose model has a tokenizer, is renamed for its upstream and
// passes the response cache costs about as many allocations with 128 messages and 128
// more members as with 32: the estimate scans the body once, and the tokenizer, the
// rename and the cache read what the scan kept instead of decoding the JSON again.
// The upstream gets its provider's model name.
func TestEveryStageReadsTheOneScan(t *testing.T) {
	if testing.Short() {
		t.Skip("counts allocations of whole requests")
	}
	var renamed bool
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		renamed = bytes.Contains(b, []byte(`"gpt-4o-2024-08-06"`)) || bytes.Contains(b, []byte(`"claude-sonnet-4-5"`))
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"id":"x","usage":{"prompt_tokens":20,"completion_tokens":5}}`))
	}))
	defer backend.Close()
	srv := server.New(server.Options{Store: budget.NewMemory(budget.SystemClock{}, 1000000),
		Metrics: metrics.New(prometheus.NewRegistry()), Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), AccessLog: io.Discard})
	doc := strings.NewReplacer("UPSTREAM", backend.URL, "HASH", keyHash("sk-alice")).Replace(parseOnceDoc)
	if _, err := srv.Apply([]byte(doc), "test"); err != nil {
		t.Fatal(err)
	}
	for _, route := range []string{"/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages"} {
		model := "gpt-4o"
		if route == "/v1/messages" {
			model = "sonnet"
		}
		for _, gz := range []bool{false, true} {
			allocs := func(n int) float64 {
				body := []byte(parseOnceBody(route, model, n))
				if gz {
					var b bytes.Buffer
					zw := gzip.NewWriter(&b)
					_, _ = zw.Write(body)
					_ = zw.Close()
					body = b.Bytes()
				}
				return testing.AllocsPerRun(20, func() {
					req := httptest.NewRequest("POST", route, bytes.NewReader(body))
					req.Header.Set("Authorization", "Bearer sk-alice")
					if gz {
						req.Header.Set("Content-Encoding", "gzip")
					}
					if route != "/v1/responses" {
						// Never a hit: the request is forwarded, and renamed, every time.
						// A Responses call that does not say store: false is never cached.
						req.Header.Set("Cache-Control", "no-store")
					}
					renamed = false
					w := httptest.NewRecorder()
					srv.ServeHTTP(w, req)
					if w.Code != http.StatusOK || !renamed {
						t.Fatalf("%s: status %d, renamed %v: %s", route, w.Code, renamed, w.Body)
					}
				})
			}
			one, many := allocs(32), allocs(128)
			// Only the buffers that hold the body (read, gunzipped, forwarded) grow with it;
			// decoding the JSON again costs thousands more.
			if many-one > 64 {
				t.Errorf("%s (gzip %v): %.0f allocations with 32 messages, %.0f with 128: the body is read again", route, gz, one, many)
			}
		}
	}
}
