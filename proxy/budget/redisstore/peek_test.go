// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package redisstore_test

import (
	"context"
	"fmt"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/proxy/budget/storetest"
	"github.com/tokenwarden/tokenwarden/proxy/config"
)

var _ = Describe("Explain on the Redis store", func() {
	It("reads each bucket's level on the fleet's totals, without taking from it", func() {
		ctx := context.Background()
		c, err := config.Parse([]byte(fmt.Sprintf(`
upstreams: [{name: default, url: "http://127.0.0.1:1"}]
api_keys: [{name: alice, key_sha256: "%064x"}]
rate_limiting:
  storage: redis
  redis: {url: "redis://127.0.0.1:1"}
  budget_division: {replicas: 2}
  limits: {per_api_key: {tokens_per_minute: 30000}}
  rules: [{name: llm/month, dimension: api_key, windows: [{limit: 1000000, calendar: {every: month}}]}]
`, 1)))
		Expect(err).NotTo(HaveOccurred())
		p := budget.NewPolicy(c)
		clock := storetest.NewClock()
		s := newStore(clock, nil, nil)
		DeferCleanup(s.Close)
		l := budget.NewLimiter(s, budget.NopRecorder{}, clock, true)
		id := budget.Identity{Key: p.Key("alice")}

		e := l.Explain(ctx, p, id, true)
		Expect(e.Levels).To(Equal("shared"))
		Expect(e.Budgets).To(HaveLen(2))
		Expect(*e.Budgets[0].Remaining).To(BeNumerically("==", 30000), "an absent bucket is full, at the fleet's total")
		Expect(e.Budgets[0].ReplicaLimit).To(BeNumerically("==", 15000), "what each of two replicas holds in memory mode")
		Expect(e.Budgets[1].ResetsAt).NotTo(BeNil(), "a calendar window says when it starts again")

		dec, err := l.Admit(ctx, p, id, budget.Ask{Input: 2000, Output: 1000})
		Expect(err).NotTo(HaveOccurred())
		Expect(dec.Refusal).To(BeNil())
		e = l.Explain(ctx, p, id, true)
		// The minute refills 500 tokens a second on the server's clock: 50 is 0.1 s of a
		// slow host between the admission and the read, far from another 3,000 taken.
		Expect(*e.Budgets[0].Remaining).To(BeNumerically("~", 27000, 50))
		Expect(*e.Budgets[1].Remaining).To(BeNumerically("~", 997000, 1))
		Expect(e.Tightest).To(Equal(1), "10% of the minute used against 0.3% of the month")
		again := l.Explain(ctx, p, id, true)
		Expect(*again.Budgets[0].Remaining).To(BeNumerically("~", 27000, 50), "explaining takes nothing")
	})
})
