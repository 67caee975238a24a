// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package server

import (
	"crypto/sha256"
	"encoding/hex"
	"io"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/proxy/metrics"
)

// BenchmarkFingerprint is what reading a request's fingerprint costs when a rule
// counts by it, the response cache off: the hash of the request as forwarded, under
// its key's scope.
func BenchmarkFingerprint(b *testing.B) {
	sum := sha256.Sum256([]byte("sk-alice"))
	s := New(Options{Store: budget.NewMemory(budget.SystemClock{}, 1000), Metrics: metrics.New(prometheus.NewRegistry()),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), AccessLog: io.Discard})
	if _, err := s.Apply([]byte(`
upstreams: [{name: default, url: "http://127.0.0.1:1"}]
api_keys: [{name: alice, key_sha256: `+hex.EncodeToString(sum[:])+`, team: research}]
rate_limiting:
  budget_division: {replicas: 1}
  rules:
  - {name: identical, dimension: api_key, amount: requests, count_by: request_fingerprint, windows: [{limit: 100, rolling: {period: minute}}]}
`), "bench"); err != nil {
		b.Fatal(err)
	}
	body := `{"model":"gpt-4o","messages":[{"role":"user","content":"retry me"}],"max_tokens":5}`
	r := httptest.NewRequest("POST", "/v1/chat/completions", strings.NewReader(body))
	rt := s.rt.Load()
	ex := &exchange{rt: rt, route: classify(r.URL), r: r, key: rt.keys[sum], body: []byte(body)}
	ex.est.Model = "gpt-4o"
	b.ReportAllocs()
	for b.Loop() {
		_ = ex.fingerprint()
	}
}
