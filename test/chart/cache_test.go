// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package chart

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/proxy/metrics"
	"github.com/tokenwarden/tokenwarden/proxy/server"
	"github.com/tokenwarden/tokenwarden/test/fakellm"
)

// cacheExported is what a proxy with a response cache exports once a priced
// model's request has been answered from it: the same request is sent until one
// is a hit (the first's answer is stored as its body ends).
func cacheExported(t *testing.T) map[string]bool {
	t.Helper()
	backend := httptest.NewServer(fakellm.New())
	defer backend.Close()
	reg := prometheus.NewRegistry()
	mem := budget.NewMemory(budget.SystemClock{}, 100)
	srv := server.New(server.Options{Store: mem, Memory: mem, Metrics: metrics.New(reg), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	doc := `
upstreams: [{name: fake, url: "` + backend.URL + `"}]
models: [{name: m, price: {input: 2.5, output: 10}, upstreams: [{upstream: fake}]}]
api_keys: [{name: alice, key_sha256: "` + sha256Hex("sk-alice") + `"}]
rate_limiting: {budget_division: {replicas: 1}}
cache: {storage: memory}
`
	if _, err := srv.Apply([]byte(doc), "test"); err != nil {
		t.Fatal(err)
	}
	front := httptest.NewServer(srv)
	defer front.Close()
	deadline := time.Now().Add(30 * time.Second)
	for {
		req, _ := http.NewRequest("POST", front.URL+"/v1/chat/completions", strings.NewReader(`{"model":"m","max_tokens":100}`))
		req.Header.Set("Authorization", "Bearer sk-alice")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		if resp.Header.Get("X-Tokenwarden-Cache") == "hit" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no request was a cache hit")
		}
		time.Sleep(20 * time.Millisecond)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, mf := range mfs {
		out[mf.GetName()] = true
	}
	return out
}
