// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package budget_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/proxy/config"
	"github.com/tokenwarden/tokenwarden/proxy/metrics"
)

// benchRules are a key's limits and four rule windows: what a request draws on in a
// fleet with per-key, per-team and global rules.
const benchRules = `
  limits:
    per_api_key: {tokens_per_minute: 1000000000, tokens_per_day: 1000000000000}
  rules:
  - {name: key, dimension: api_key, windows: [{limit: 1e12, rolling: {period: minute}}, {limit: 1e13, rolling: {period: day}}]}
  - {name: team, dimension: team, windows: [{limit: 1e12, rolling: {period: hour}}]}
  - {name: all, dimension: global, windows: [{limit: 1e13, rolling: {period: hour}}]}
`

// BenchmarkAdmitSettle is one request's admission and its settlement for less than
// it reserved (the common case: the output ceiling is above what the backend
// produced), on a memory store with the proxy's metrics.
func BenchmarkAdmitSettle(b *testing.B) {
	c, err := config.Parse([]byte(`
upstreams: [{name: default, url: "http://127.0.0.1:1"}]
api_keys:
- {name: alice, team: research, key_sha256: "0000000000000000000000000000000000000000000000000000000000000001"}
rate_limiting:
  budget_division: {replicas: 1}
` + benchRules))
	if err != nil {
		b.Fatal(err)
	}
	p := budget.NewPolicy(c)
	l := budget.NewLimiter(budget.NewMemory(budget.SystemClock{}, 1000), metrics.New(prometheus.NewRegistry()), budget.SystemClock{}, false)
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
}

// BenchmarkTenantBudgets is one request's admission and settlement under two
// budgets: two of the platform's (a global and a per-team rule, as a fleet without
// tenants has), or the platform's global rule and its tenant's, alone or beside 100
// other tenants' rules, which the request never looks at.
func BenchmarkTenantBudgets(b *testing.B) {
	key := func(tenant string) string {
		return `- {name: alice, team: research, tenant: "` + tenant + `", key_sha256: "0000000000000000000000000000000000000000000000000000000000000001"}` + "\n"
	}
	platform := "  - {name: llm/all, dimension: global, windows: [{limit: 1e13, rolling: {period: hour}}]}\n"
	others := ""
	for i := range 100 {
		others += fmt.Sprintf("  - {name: t%[1]d/cap, tenant: t%[1]d, dimension: global, windows: [{limit: 1e12, rolling: {period: hour}}]}\n", i)
	}
	for _, bc := range []struct{ name, keys, rules string }{
		{"platform=2", key(""), platform + "  - {name: llm/team, dimension: team, windows: [{limit: 1e12, rolling: {period: hour}}]}\n"},
		{"platform=1/tenant=1", key("team-a"), platform + "  - {name: team-a/cap, tenant: team-a, dimension: global, windows: [{limit: 1e12, rolling: {period: hour}}]}\n"},
		{"platform=1/tenant=1/tenants=101", key("team-a"), platform + "  - {name: team-a/cap, tenant: team-a, dimension: global, windows: [{limit: 1e12, rolling: {period: hour}}]}\n" + others},
	} {
		b.Run(bc.name, func(b *testing.B) {
			c, err := config.Parse([]byte("upstreams: [{name: default, url: \"http://127.0.0.1:1\"}]\napi_keys:\n" + bc.keys +
				"rate_limiting:\n  budget_division: {replicas: 1}\n  rules:\n" + bc.rules))
			if err != nil {
				b.Fatal(err)
			}
			p := budget.NewPolicy(c)
			l := budget.NewLimiter(budget.NewMemory(budget.SystemClock{}, 1000), metrics.New(prometheus.NewRegistry()), budget.SystemClock{}, false)
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
		})
	}
}

// BenchmarkInFlightRule is one request's admission and settlement under benchRules,
// and beside them one in-flight rule counted by session (a slot taken and given back
// in this replica's memory), so that the difference is the rule's cost.
func BenchmarkInFlightRule(b *testing.B) {
	inFlight := "  - {name: two-per-session, dimension: api_key, count_by: session, amount: in_flight, windows: [{limit: 2}]}\n"
	perSession := "  - {name: per-session, dimension: api_key, count_by: session, windows: [{limit: 1000000000, rolling: {period: hour}}]}\n"
	for _, bc := range []struct{ name, rules string }{
		{"rules=4", benchRules}, {"rules=4+in_flight", benchRules + inFlight}, {"rules=4+per_session", benchRules + perSession},
	} {
		b.Run(bc.name, func(b *testing.B) {
			c, err := config.Parse([]byte(`
upstreams: [{name: default, url: "http://127.0.0.1:1"}]
api_keys:
- {name: alice, team: research, key_sha256: "0000000000000000000000000000000000000000000000000000000000000001"}
rate_limiting:
  budget_division: {replicas: 1}
` + bc.rules))
			if err != nil {
				b.Fatal(err)
			}
			p := budget.NewPolicy(c)
			l := budget.NewLimiter(budget.NewMemory(budget.SystemClock{}, 1000), metrics.New(prometheus.NewRegistry()), budget.SystemClock{}, false)
			id := budget.Identity{Key: p.Key("alice"), Session: "s1"}
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				dec, err := l.Admit(ctx, p, id, budget.Ask{Input: 500, Output: 1000})
				if err != nil || dec.Refusal != nil || dec.Hold == nil {
					b.Fatalf("not admitted: %v %+v", err, dec.Refusal)
				}
				dec.Hold.Settle(budget.Used{Input: 500, Output: 200})
			}
		})
	}
}
