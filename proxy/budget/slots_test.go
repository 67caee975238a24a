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
