// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package server_test

import (
	"fmt"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/proxy/budget/redisstore"
	"github.com/tokenwarden/tokenwarden/proxy/server"
	"github.com/tokenwarden/tokenwarden/test/fakellm"
	"github.com/tokenwarden/tokenwarden/test/redisserver"
)

// loggedRedisProxy is a proxy on a shared Redis that settles off the request's
// goroutine, as the binary does, and writes its access log to out.
func loggedRedisProxy(h *harness, redisURL string, out *logLines, doc string) string {
	GinkgoHelper()
	return startRedisProxy(h, redisstore.Options{URL: redisURL, Prefix: fmt.Sprintf("debt%d", redisPrefixes.Add(1)),
		DialTimeout: time.Second, ReadTimeout: time.Second, WriteTimeout: time.Second}, false, doc, server.Options{AccessLog: out}).url
}

var _ = Describe("The access log's settlement", func() {
	var out *logLines
	BeforeEach(func() { out = &logLines{} })

	// Alice's key has 1000 tokens a minute. A request reserves chatEstimate(50), and
	// the upstream reports 1200: the overage takes the bucket from 1000-reserved down
	// to -200, so 200 tokens went into debt.
	overspend := fakellm.Behaviour{InputTokens: 100, OutputTokens: 1100}

	It("tells the tokens no bucket could cover, on the memory store", func() {
		h := newObservedHarness(loggedDoc, server.Options{AccessLog: out})
		h.llm.Set(overspend)
		r := h.chat("sk-alice", 50)
		Expect(r.code).To(Equal(200))
		l := out.logged(id(r))
		Expect(l).To(HaveKeyWithValue("settlement", map[string]any{"outcome": "settled", "refund": 0.0,
			"overage": 1200 - chatEstimate(50), "debt": 200.0}))
		Expect(h.level(budget.TokensMinute, budget.APIKey, "alice", 1000)).To(BeNumerically("~", -200, 0.01),
			"the line tells the debt the bucket holds")

		By("a request that fits in its reservation owes nothing")
		h.llm.Set(fakellm.Behaviour{InputTokens: 1, OutputTokens: 1})
		h.clock.Advance(time.Minute) // the debt repaid, and 800 tokens refilled
		r = h.chat("sk-alice", 50)
		Expect(r.code).To(Equal(200))
		Expect(out.logged(id(r))["settlement"]).NotTo(HaveKey("debt"))
	})

	It("counts only what went below zero when the bucket covers part of the overage", func() {
		h := newObservedHarness(loggedDoc, server.Options{AccessLog: out})
		h.llm.Set(fakellm.Behaviour{InputTokens: 100, OutputTokens: 800}) // 900 of 1000: covered
		r := h.chat("sk-alice", 50)
		Expect(out.logged(id(r))["settlement"]).To(And(HaveKeyWithValue("overage", 900-chatEstimate(50)), Not(HaveKey("debt"))))
		h.llm.Set(fakellm.Behaviour{InputTokens: 100, OutputTokens: 50}) // 150, of which 100 left
		r = h.chat("sk-alice", 50)
		Expect(r.code).To(Equal(200))
		Expect(out.logged(id(r))["settlement"]).To(HaveKeyWithValue("debt", 50.0))
	})

	It("tells nothing owed under overage: forgive", func() {
		h := newObservedHarness(loggedDoc+"  overage: forgive\n", server.Options{AccessLog: out})
		h.llm.Set(overspend)
		r := h.chat("sk-alice", 50)
		Expect(out.logged(id(r))["settlement"]).To(And(HaveKeyWithValue("overage", 1200-chatEstimate(50)), Not(HaveKey("debt"))))
	})

	It("tells the debt a shared Redis settled off the request's goroutine", func() {
		redis := redisserver.Start(GinkgoT())
		h := newHarness(keysDoc)
		url := loggedRedisProxy(h, redis.URL(), out, redisDoc(redis.URL(), false, "1000"))
		h.llm.Set(fakellm.Behaviour{InputTokens: 1, OutputTokens: 1})
		r := h.chatAt(url, "sk-bob", 50)
		Expect(r.code).To(Equal(200))
		Expect(out.logged(id(r))["settlement"]).To(And(HaveKeyWithValue("refund", chatEstimate(50)-2), Not(HaveKey("debt"))),
			"the team's bucket covers bob's usage")

		h.llm.Set(overspend)
		r = h.chatAt(url, "sk-alice", 50)
		Expect(r.code).To(Equal(200))
		// The team's bucket, at 998, refills on the Redis clock (1000 a minute) while the
		// requests run: 202 owed, less a few tokens.
		Expect(out.logged(id(r))["settlement"]).To(And(HaveKeyWithValue("overage", 1200-chatEstimate(50)),
			HaveKeyWithValue("debt", BeNumerically("~", 200, 10))))
	})

	It("tells a cost budget's debt in dollars", func() {
		redis := redisserver.Start(GinkgoT())
		h := newHarness(keysDoc)
		// $0.001 a day for alice's key. gpt-4o costs $2.50 per million input tokens and
		// $10 per million output tokens: the request reserves 21 input and 50 output
		// tokens ($0.0005525) and uses 100 and 100 ($0.00125), $0.00025 more than the
		// bucket holds.
		url := loggedRedisProxy(h, redis.URL(), out, fmt.Sprintf(`
upstreams: [{name: default, url: UPSTREAM}]
models:
- {name: gpt-4o, price: {input: 2.5, output: 10}}
api_keys:
- {name: alice, key_sha256: HASH(alice), user: alice, team: research}
rate_limiting:
  storage: redis
  redis: {url: "%s"}
  budget_division: {replicas: 1}
  rules:
  - {name: key-cost, dimension: api_key, amount: cost, windows: [{limit: 0.001, rolling: {period: day}}]}
`, redis.URL()))
		h.llm.Set(fakellm.Behaviour{InputTokens: 100, OutputTokens: 100})
		r := h.chatAt(url, "sk-alice", 50)
		Expect(r.code).To(Equal(200))
		Expect(out.logged(id(r))["settlement"]).To(And(HaveKeyWithValue("debt_usd", BeNumerically("~", 0.00025, 1e-7)),
			Not(HaveKey("debt"))), "no token bucket owes")
	})
})
