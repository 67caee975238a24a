// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package redisstore_test

import (
	"context"
	"strconv"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/proxy/config"
	"github.com/tokenwarden/tokenwarden/proxy/metrics"
	"github.com/tokenwarden/tokenwarden/test/redisserver"
)

// BenchmarkValueBound is one request's admission and settlement through the limiter
// on a real redis-server, for a rule counted by the key (key) and the same rule
// counted by the session under the key (session), whose bound on distinct values is
// one more script call. The requests cycle through 100 sessions, within the bound. It
// reports the script calls per request and Redis' own time in them (evalsha usec).
func BenchmarkValueBound(b *testing.B) {
	for _, by := range []string{"key", "session"} {
		b.Run(by, func(b *testing.B) { benchValueBound(b, by) })
	}
}

func benchValueBound(b *testing.B, by string) {
	s := benchStore(b)
	rule := `{name: each, dimension: api_key, amount: requests, windows: [{limit: 1e12, rolling: {period: minute}}]}`
	if by == "session" {
		rule = `{name: each, dimension: api_key, count_by: session, amount: requests, windows: [{limit: 1e12, rolling: {period: minute}}]}`
	}
	c, err := config.Parse([]byte(`
upstreams: [{name: default, url: "http://127.0.0.1:1"}]
api_keys:
- {name: alice, team: research, key_sha256: "0000000000000000000000000000000000000000000000000000000000000001"}
rate_limiting:
  storage: redis
  redis: {url: "redis://127.0.0.1:1"}
  limits:
    per_api_key: {tokens_per_minute: 1000000000}
  rules:
  - ` + rule + `
`))
	if err != nil {
		b.Fatal(err)
	}
	p := budget.NewPolicy(c)
	l := budget.NewLimiter(s, metrics.New(prometheus.NewRegistry()), budget.SystemClock{}, true)
	ctx := context.Background()
	ids := make([]budget.Identity, 100)
	for i := range ids {
		ids[i] = budget.Identity{Key: p.Key("alice"), Session: "session-" + strconv.Itoa(i)}
	}
	admit := func(i int) {
		dec, err := l.Admit(ctx, p, ids[i%len(ids)], budget.Ask{Input: 500, Output: 1000})
		if err != nil || dec.Refusal != nil || dec.Hold == nil {
			b.Fatalf("not admitted: %v", err)
		}
		dec.Hold.Settle(budget.Used{Input: 500, Output: 200})
	}
	for i := range ids { // load the scripts, and every session's value
		admit(i)
	}
	if err := l.Wait(ctx); err != nil {
		b.Fatal(err)
	}
	s.Client().ConfigResetStat(ctx)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		admit(i)
	}
	b.StopTimer()
	if err := l.Wait(ctx); err != nil {
		b.Fatal(err)
	}
	calls, usec, err := redisserver.Commandstat(ctx, s.Client(), "evalsha")
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(calls)/float64(b.N), "calls/op")
	b.ReportMetric(usec/float64(b.N), "redis-µs/op")
}
