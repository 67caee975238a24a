// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package budget_test

import (
	"context"
	"testing"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/proxy/budget/storetest"
	"github.com/tokenwarden/tokenwarden/proxy/config"
)

// TestInFlightSlotsAreGivenBackOnEveryEnd admits requests of one session under an
// in-flight limit of 1 and a day's tokens, and ends each in one way: the slot is back
// after a settlement, a release, and a refusal by the token budget, and once only.
func TestInFlightSlotsAreGivenBackOnEveryEnd(t *testing.T) {
	c, err := config.Parse([]byte(`
upstreams: [{name: default, url: "http://127.0.0.1:1"}]
api_keys:
- {name: alice, key_sha256: "0000000000000000000000000000000000000000000000000000000000000001"}
rate_limiting:
  budget_division: {replicas: 4}
  rules:
  - {name: one, dimension: api_key, count_by: session, amount: in_flight, windows: [{limit: 1}]}
  - {name: day, dimension: api_key, windows: [{limit: 4000, rolling: {period: day}}]}
`))
	if err != nil {
		t.Fatal(err)
	}
	clock := storetest.NewClock()
	p := budget.NewPolicy(c)
	l := budget.NewLimiter(budget.NewMemory(clock, 1000), budget.NopRecorder{}, clock, false)
	ctx := context.Background()
	admit := func(session string, ask budget.Ask) budget.Decision {
		t.Helper()
		dec, err := l.Admit(ctx, p, budget.Identity{Key: p.Key("alice"), Session: session}, ask)
		if err != nil {
			t.Fatal(err)
		}
		return dec
	}
	small := budget.Ask{Input: 10, Output: 10}
	held := func(what string) *budget.Hold {
		t.Helper()
		dec := admit("s1", small)
		if dec.Refusal != nil || dec.Hold == nil {
			t.Fatalf("%s: the slot is not back: %+v", what, dec.Refusal)
		}
		ref := admit("s1", small).Refusal
		if ref == nil || ref.Amount != budget.AmountInFlight || ref.Rule != "one" || ref.Bucket.Limit != 1 || ref.RetryAfter <= 0 {
			t.Fatalf("%s: a second request of s1 in flight: %+v", what, ref)
		}
		if !admit("s2", small).Hold.Release() {
			t.Fatalf("%s: another session is not its own", what)
		}
		return dec.Hold
	}
	h := held("the first, a limit of 1 on each of 4 replicas (never divided)")
	h.Settle(budget.Used{Input: 10, Output: 5})
	h.Release() // after a settlement: nothing more
	h = held("after a settlement")
	h.Release()
	h.Release()
	h = held("after a release")
	h.Release()
	// The day's share is 1000 tokens: a request of 2000 is refused by it, after its slot.
	if ref := admit("s1", budget.Ask{Input: 1000, Output: 1000}).Refusal; ref == nil || ref.Rule != "day" {
		t.Fatalf("the token budget did not refuse: %+v", ref)
	}
	held("after a refusal by the token budget").Release()
}

// TestExplainTellsRequestsInFlight: explain names an in-flight window first, with its
// limit and this replica's requests in flight in the request's counter, and a reader
// who may not read the budget's tenant is not told them.
func TestExplainTellsRequestsInFlight(t *testing.T) {
	c, err := config.Parse([]byte(`
upstreams: [{name: default, url: "http://127.0.0.1:1"}]
api_keys:
- {name: alice, key_sha256: "0000000000000000000000000000000000000000000000000000000000000001"}
rate_limiting:
  budget_division: {replicas: 4}
  rules:
  - {name: day, dimension: api_key, windows: [{limit: 4000, rolling: {period: day}}]}
  - {name: two, dimension: api_key, count_by: session, amount: in_flight, windows: [{limit: 2}]}
`))
	if err != nil {
		t.Fatal(err)
	}
	clock := storetest.NewClock()
	p := budget.NewPolicy(c)
	l := budget.NewLimiter(budget.NewMemory(clock, 1000), budget.NopRecorder{}, clock, false)
	ctx := context.Background()
	id := budget.Identity{Key: p.Key("alice"), Session: "s1"}
	dec, err := l.Admit(ctx, p, id, budget.Ask{Input: 10, Output: 10})
	if err != nil || dec.Refusal != nil {
		t.Fatalf("admit: %v %+v", err, dec.Refusal)
	}
	defer dec.Hold.Release()
	e := l.Explain(ctx, p, id, true)
	if len(e.Budgets) != 2 {
		t.Fatalf("explained %d budgets, want the in-flight window and the day", len(e.Budgets))
	}
	b := e.Budgets[0]
	if b.Rule != "two" || b.Order != 1 || b.Window != "in_flight" || b.Limit != 2 || b.ReplicaLimit != 2 || b.By != "s1" {
		t.Fatalf("the in-flight window is not first, whole: %+v", b)
	}
	if b.InFlight == nil || *b.InFlight != 1 || b.InFlightOf != "replica" || *b.Remaining != 1 || *b.UsedPercent != 50 {
		t.Fatalf("the in-flight window's count: %+v", b)
	}
	if e.Tightest != 1 {
		t.Errorf("tightest %d: one of two in flight is tighter than a day's 20 tokens of 2000", e.Tightest)
	}
	e.Withhold(func(string) bool { return false })
	if b := e.Budgets[0]; b.InFlight != nil || b.Remaining != nil || !b.LevelWithheld || e.Tightest != 0 {
		t.Errorf("withheld from a reader who may not read it: %+v, tightest %d", b, e.Tightest)
	}
}
