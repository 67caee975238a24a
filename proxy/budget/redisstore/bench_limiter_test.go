// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package redisstore_test

import (
	"context"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/proxy/config"
	"github.com/tokenwarden/tokenwarden/proxy/metrics"
)

// BenchmarkAdmitSettle is one request's admission and its settlement for less than
// it reserved, through the proxy's limiter (refunds sent without waiting) and
// metrics, on a real redis-server: a key's limits and four rule windows.
func BenchmarkAdmitSettle(b *testing.B) {
	s := benchStore(b)
	c, err := config.Parse([]byte(`
upstreams: [{name: default, url: "http://127.0.0.1:1"}]
api_keys:
- {name: alice, team: research, key_sha256: "0000000000000000000000000000000000000000000000000000000000000001"}
rate_limiting:
  storage: redis
  redis: {url: "redis://127.0.0.1:1"}
  limits:
    per_api_key: {tokens_per_minute: 1000000000, tokens_per_day: 1000000000000}
  rules:
  - {name: key, dimension: api_key, windows: [{limit: 1e12, rolling: {period: minute}}, {limit: 1e13, rolling: {period: day}}]}
  - {name: team, dimension: team, windows: [{limit: 1e12, rolling: {period: hour}}]}
  - {name: all, dimension: global, windows: [{limit: 1e13, rolling: {period: hour}}]}
`))
	if err != nil {
		b.Fatal(err)
	}
	p := budget.NewPolicy(c)
	l := budget.NewLimiter(s, metrics.New(prometheus.NewRegistry()), budget.SystemClock{}, true)
	id := budget.Identity{Key: p.Key("alice")}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		dec, err := l.Admit(ctx, p, id, budget.Ask{Input: 500, Output: 1000})
		if err != nil || dec.Refusal != nil || dec.Hold == nil {
			b.Fatalf("not admitted: %v", err)
		}
		dec.Hold.Settle(budget.Used{Input: 500, Output: 200})
	}
	b.StopTimer()
	if err := l.Wait(ctx); err != nil {
		b.Fatal(err)
	}
}
