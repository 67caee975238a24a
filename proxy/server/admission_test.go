// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package server_test

import (
	"strconv"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/test/fakellm"
)

const keysDoc = `
upstreams:
- name: default
  url: UPSTREAM
api_keys:
- {name: alice, key_sha256: HASH(alice), user: alice, team: research}
- {name: bob, key_sha256: HASH(bob), user: bob, team: research}
- {name: root, key_sha256: HASH(root), bypass: true}
rate_limiting:
  budget_division: {replicas: 1}
`

var _ = Describe("Admission and settlement", func() {
	It("answers a request inside the budget and settles it on the reported usage", func() {
		h := newHarness(keysDoc + `
  limits:
    per_api_key: {tokens_per_minute: 6000}
`)
		r := h.chat("sk-alice", 100)
		Expect(r.code).To(Equal(200))
		Expect(r.header.Get("X-Ratelimit-Tokens-Limit")).To(Equal("6000"))
		Expect(r.header.Get("X-Ratelimit-Tokens-Remaining")).To(Equal(strconv.Itoa(6000 - int(chatEstimate(100)))))
		Expect(r.header.Get("X-Ratelimit-Limit-Tokens")).To(Equal("6000"))
		// The fake backend reports 10 input and 20 output tokens: the hold of 107 settles to 30.
		Eventually(func() float64 { return h.level(budget.TokensMinute, budget.APIKey, "alice", 6000) }).
			Should(BeNumerically("~", 6000-30, 0.01))
		Expect(counter(h.m.TokenBudgetTokens.WithLabelValues("api_key", "reserved"))).To(Equal(chatEstimate(100)))
		Expect(counter(h.m.TokenBudgetTokens.WithLabelValues("api_key", "refunded"))).To(Equal(chatEstimate(100) - 30))
		Expect(counter(h.m.KeyUsage.WithLabelValues("alice", "output"))).To(Equal(20.0))
	})

	It("reserves the default output ceiling when the request states none", func() {
		h := newHarness(keysDoc + `
  limits:
    per_api_key: {tokens_per_minute: 5000}
`)
		h.llm.Set(fakellm.Behaviour{Latency: 0, OmitUsage: true})
		r := h.do("POST", "/v1/chat/completions", "sk-alice", `{"model":"m","messages":[{"role":"user","content":"hello there"}]}`)
		Expect(r.code).To(Equal(200))
		// Input: keys model 2, messages 2, role 1, content 2; "m" 1, "user" 1, "hello there" 3; floor 4.
		Expect(r.header.Get("X-Ratelimit-Tokens-Remaining")).To(Equal(strconv.Itoa(5000 - 16 - 4096)))
	})

	It("settles an answer without usage on the input estimate plus the output it carries", func() {
		h := newHarness(keysDoc + `
  limits:
    per_api_key: {tokens_per_minute: 6000}
`)
		h.llm.Set(fakellm.Behaviour{OmitUsage: true, OutputTokens: 5})
		Expect(h.chat("sk-alice", 100).code).To(Equal(200))
		// The input estimate; "word word word word word" is 24 bytes, 6 tokens.
		Eventually(func() float64 { return h.level(budget.TokensMinute, budget.APIKey, "alice", 6000) }).Should(BeNumerically("~", 6000-chatInput-6, 0.01))
		Expect(counter(h.m.Settlements.WithLabelValues("settled"))).To(Equal(1.0))
	})

	It("releases the hold of a failed answer and passes the backend's error through", func() {
		h := newHarness(keysDoc + `
  limits:
    per_api_key: {tokens_per_minute: 6000}
`)
		h.llm.Set(fakellm.Behaviour{Status: 500})
		r := h.chat("sk-alice", 100)
		Expect(r.code).To(Equal(500))
		Expect(r.errorField("error", "message")).To(Equal("fake error 500"))
		Expect(h.level(budget.TokensMinute, budget.APIKey, "alice", 6000)).To(BeNumerically("~", 6000, 0.01))
	})

	DescribeTable("charges an overage the bucket cannot cover as the overage rule says",
		func(rule string, after, charged float64, retryAfter string, remaining int) {
			h := newHarness(keysDoc + `
  overage: ` + rule + `
  limits:
    per_api_key: {tokens_per_minute: 600}
`)
			h.llm.Set(fakellm.Behaviour{InputTokens: 10, OutputTokens: 200})
			Expect(h.chat("sk-alice", 10).code).To(Equal(200)) // reserves 33, uses 210
			Eventually(func() float64 { return h.level(budget.TokensMinute, budget.APIKey, "alice", 600) }).Should(BeNumerically("~", 390, 0.01))
			h.llm.Set(fakellm.Behaviour{InputTokens: 10, OutputTokens: 500})
			Expect(h.chat("sk-alice", 10).code).To(Equal(200)) // uses 510: the hold of 33 stays charged; 477 more, with 357 left
			Eventually(func() float64 { return h.level(budget.TokensMinute, budget.APIKey, "alice", 600) }).Should(BeNumerically("~", after, 0.01))
			Expect(counter(h.m.TokenBudgetTokens.WithLabelValues("api_key", "charged"))).To(Equal(charged))
			r := h.chat("sk-alice", 400) // reserves 423
			Expect(r.code).To(Equal(429))
			Expect(r.header.Get("Retry-After")).To(Equal(retryAfter))
			Expect(r.errorField("error", "details", "remaining")).To(BeNumerically("==", remaining))
		},
		Entry("debt (the default): the bucket owes 120, repaid by waiting", "debt", -120.0, 177.0+477, "55", 0), // 120 + 423 at 10 a second
		Entry("forgive: the 477 that do not fit consume nothing", "forgive", 357.0, 177.0, "7", 357),            // 66 missing
	)

	It("refuses what does not fit with a 429 the caller can act on", func() {
		h := newHarness(keysDoc + `
  limits:
    per_api_key: {tokens_per_minute: 600}
`)
		h.llm.Set(fakellm.Behaviour{InputTokens: 300, OutputTokens: 200})
		Expect(h.chat("sk-alice", 400).code).To(Equal(200)) // settles at 500: 100 left
		r := h.chat("sk-alice", 400-chatInput-1)            // needs 399
		Expect(r.code).To(Equal(429))
		Expect(r.errorField("error", "type")).To(Equal("rate_limit_exceeded"))
		Expect(r.errorField("error", "limit_type")).To(Equal("token_budget"))
		Expect(r.errorField("error", "details", "token_dimension")).To(Equal("api_key"))
		Expect(r.errorField("error", "details", "capacity")).To(BeNumerically("==", 600))
		Expect(r.errorField("error", "details", "remaining")).To(BeNumerically("==", 100))
		Expect(r.errorField("error", "details")).NotTo(HaveKey("token_budget"), "only one period is configured")
		// 299 tokens missing at 10 per second.
		Expect(r.header.Get("Retry-After")).To(Equal("30"))
		Expect(r.header.Get("Retry-After-Ms")).To(Equal("29900"))
		Expect(r.header.Get("X-Ratelimit-Tokens-Remaining")).To(Equal("100"))
		Expect(counter(h.m.TokenBudgetRefusals.WithLabelValues("api_key"))).To(Equal(1.0))
		Expect(counter(h.m.Exceeded.WithLabelValues("token_budget"))).To(Equal(1.0))
		Expect(h.llm.Requests()).To(HaveLen(1), "a refused request never reaches the backend")

		h.clock.Advance(30 * time.Second)
		Expect(h.chat("sk-alice", 400-chatInput-1).code).To(Equal(200), "the Retry-After is enough")
	})

	It("refuses a request larger than the whole budget at once, telling the time its own cost needs", func() {
		h := newHarness(keysDoc + `
  limits:
    global: {tokens_per_minute: 600}
`)
		r := h.chat("sk-alice", 1200-chatInput) // 1200 tokens at 10 per second
		Expect(r.code).To(Equal(429))
		Expect(r.header.Get("Retry-After")).To(Equal("120"))
	})

	It("never reveals a shared dimension's level", func() {
		h := newHarness(keysDoc + `
  limits:
    global: {tokens_per_minute: 100}
    per_api_key: {requests_per_second: 5, burst_capacity: 10}
`)
		r := h.chat("sk-alice", 200)
		Expect(r.code).To(Equal(429))
		Expect(r.errorField("error", "details", "token_dimension")).To(Equal("global"))
		Expect(r.errorField("error", "details")).NotTo(HaveKey("capacity"))
		Expect(r.errorField("error", "details")).NotTo(HaveKey("remaining"))
		for _, name := range []string{"X-Ratelimit-Tokens-Limit", "X-Ratelimit-Tokens-Remaining", "X-Ratelimit-Remaining-Tokens", "X-Ratelimit-Tokens-Day-Remaining"} {
			Expect(r.header.Get(name)).To(BeEmpty(), name)
		}
		Expect(r.header.Get("Retry-After")).NotTo(BeEmpty())
		// The caller's own request-count quota is still reported: it admitted the request.
		Expect(r.header.Get("X-Ratelimit-Limit-Requests")).To(Equal("10"))
		Expect(r.header.Get("X-Ratelimit-Remaining-Requests")).To(Equal("9"))
	})

	It("names the exhausted period when both are configured", func() {
		h := newHarness(keysDoc + `
  limits:
    per_team: {tokens_per_minute: 100000, tokens_per_day: 1000}
`)
		h.llm.Set(fakellm.Behaviour{InputTokens: 900, OutputTokens: 0})
		Expect(h.chat("sk-alice", 100).code).To(Equal(200))
		r := h.chat("sk-bob", 100) // the same team
		Expect(r.code).To(Equal(429))
		Expect(r.errorField("error", "details", "token_dimension")).To(Equal("team"))
		Expect(r.errorField("error", "details", "token_budget")).To(Equal("day"))
		Expect(counter(h.m.TokenBudgetPeriodRefusal.WithLabelValues("team", "day"))).To(Equal(1.0))
		Expect(h.level(budget.TokensMinute, budget.Team, "research", 100000)).To(BeNumerically("~", 100000-900, 1), "a day refusal never drains the minute budget")
	})

	It("refuses in the Anthropic shape on the messages routes", func() {
		h := newHarness(keysDoc + `
  limits:
    per_user: {tokens_per_minute: 100}
`)
		for _, path := range []string{"/v1/messages", "/anthropic/v1/messages"} {
			r := h.do("POST", path, "", `{"model":"claude","max_tokens":500,"messages":[{"role":"user","content":"hi"}]}`, "x-api-key", "sk-alice")
			Expect(r.code).To(Equal(429), path)
			Expect(r.json["type"]).To(Equal("error"))
			Expect(r.errorField("error", "type")).To(Equal("rate_limit_error"))
			Expect(r.errorField("error", "limit_type")).To(Equal("token_budget"))
			Expect(r.errorField("error", "details", "token_dimension")).To(Equal("user"))
		}
	})

	It("refuses a request-count overrun with its own limit type, before any token is taken", func() {
		h := newHarness(keysDoc + `
  limits:
    per_api_key: {requests_per_second: 1, burst_capacity: 1, tokens_per_minute: 10000}
`)
		Expect(h.chat("sk-alice", 10).code).To(Equal(200))
		r := h.chat("sk-alice", 10)
		Expect(r.code).To(Equal(429))
		Expect(r.errorField("error", "limit_type")).To(Equal("requests"))
		Expect(r.errorField("error", "details", "dimension")).To(Equal("api_key"))
		Expect(r.header.Get("Retry-After")).To(Equal("1"))
		Expect(counter(h.m.Exceeded.WithLabelValues("requests"))).To(Equal(1.0))
	})

	It("exempts whitelisted clients and bypass keys from every limit", func() {
		h := newHarness(keysDoc + `
  whitelist: ["127.0.0.1/32"]
  limits:
    global: {tokens_per_minute: 10}
`)
		Expect(h.chat("sk-alice", 100).code).To(Equal(200))
		Expect(h.apply(keysDoc + `
  limits:
    global: {tokens_per_minute: 10}
`)).To(Succeed())
		Expect(h.chat("sk-alice", 100).code).To(Equal(429))
		Expect(h.chat("sk-root", 100).code).To(Equal(200))
	})

	It("skips and counts a dimension the request has no identity for", func() {
		h := newHarness(`
upstreams: [{name: default, url: UPSTREAM}]
auth: {mode: optional}
api_keys:
- {name: alice, key_sha256: HASH(alice)}
rate_limiting:
  budget_division: {replicas: 1}
  limits:
    per_api_key: {tokens_per_minute: 10}
    per_user: {tokens_per_minute: 10}
`)
		Expect(h.chat("", 100).code).To(Equal(200), "anonymous traffic has no key: per_api_key is skipped")
		Expect(counter(h.m.SkippedVec.WithLabelValues("token_budget_api_key"))).To(Equal(1.0))
		Expect(h.chat("sk-alice", 100).code).To(Equal(429))
		Expect(counter(h.m.SkippedVec.WithLabelValues("token_budget_user"))).To(Equal(2.0), "alice has no user")
	})

	It("divides every allowance by the replicas, and a positive allowance divided to nothing refuses", func() {
		h := newHarness(keysDoc + `
  limits:
    global: {tokens_per_minute: 4000}
`)
		Expect(h.apply(keysDoc[:len(keysDoc)-len("  budget_division: {replicas: 1}\n")] + `
  budget_division: {replicas: 4}
  limits:
    global: {tokens_per_minute: 4000}
`)).To(Succeed())
		h.llm.Set(fakellm.Behaviour{InputTokens: 1000})
		Expect(h.chat("sk-alice", 1000-chatInput).code).To(Equal(200)) // 1000 of the 1000 per replica
		Expect(h.chat("sk-alice", 1).code).To(Equal(429))

		Expect(h.apply(keysDoc[:len(keysDoc)-len("  budget_division: {replicas: 1}\n")] + `
  budget_division: {replicas: 4}
  limits:
    global: {tokens_per_minute: 3}
    per_team: {tokens_per_minute: 0}
`)).To(Succeed())
		r := h.chat("sk-alice", 1)
		Expect(r.code).To(Equal(429), "3 divided among 4 replicas is a zero allowance, not unlimited")
		Expect(r.header.Get("Retry-After")).To(Equal("60"))
	})

	It("divides a key's minute override too and reports it in the key's headers", func() {
		h := newHarness(`
upstreams: [{name: default, url: UPSTREAM}]
api_keys:
- {name: alice, key_sha256: HASH(alice), rate_limit_tokens_per_minute: 3000}
- {name: bob, key_sha256: HASH(bob)}
rate_limiting:
  budget_division: {replicas: 3}
  limits:
    per_api_key: {tokens_per_minute: 600}
`)
		Expect(h.chat("sk-alice", 10).header.Get("X-Ratelimit-Tokens-Limit")).To(Equal("1000"))
		Expect(h.chat("sk-bob", 10).header.Get("X-Ratelimit-Tokens-Limit")).To(Equal("200"))
	})
})

var _ = Describe("Authentication", func() {
	It("answers 401 in the route's shape when the key is missing or unknown", func() {
		h := newHarness(keysDoc)
		r := h.chat("", 10)
		Expect(r.code).To(Equal(401))
		Expect(r.errorField("error", "type")).To(Equal("authentication_error"))
		r = h.do("POST", "/v1/messages", "", `{"model":"claude","max_tokens":5}`, "x-api-key", "sk-nobody")
		Expect(r.code).To(Equal(401))
		Expect(r.json["type"]).To(Equal("error"))
		Expect(r.errorField("error", "type")).To(Equal("authentication_error"))
		Expect(h.llm.Requests()).To(BeEmpty())
	})

	It("forwards the upstream's own credential, never the client's key", func() {
		GinkgoT().Setenv("FAKE_BACKEND_KEY", "upstream-secret")
		h := newHarness(`
upstreams: [{name: default, url: UPSTREAM/base, auth_header_env: FAKE_BACKEND_KEY}]
api_keys: [{name: alice, key_sha256: HASH(alice)}]
`)
		Expect(h.chat("sk-alice", 10).code).To(Equal(200))
		r := h.do("POST", "/anthropic/v1/messages", "", `{"model":"c","max_tokens":5}`, "x-api-key", "sk-alice")
		Expect(r.code).To(Equal(200))
		reqs := h.llm.Requests()
		Expect(reqs).To(HaveLen(2))
		Expect(reqs[0].Path).To(Equal("/base/v1/chat/completions"))
		Expect(reqs[0].Header.Get("Authorization")).To(Equal("Bearer upstream-secret"))
		Expect(reqs[1].Path).To(Equal("/base/v1/messages"), "the /anthropic prefix is the proxy's own")
		Expect(reqs[1].Header.Get("X-Api-Key")).To(Equal("upstream-secret"))
		Expect(reqs[1].Header.Get("Authorization")).To(BeEmpty())
	})

	It("never forwards the client's key to an upstream that has no credential of its own", func() {
		h := newHarness(`
upstreams: [{name: default, url: UPSTREAM}]
api_keys: [{name: alice, key_sha256: HASH(alice)}]
`)
		Expect(h.chat("sk-alice", 10).code).To(Equal(200))
		Expect(h.do("POST", "/v1/messages", "", `{"model":"c","max_tokens":5}`, "x-api-key", "sk-alice").code).To(Equal(200))
		Expect(h.do("POST", "/v1/chat/completions", "sk-alice", chatBody, "x-api-key", "sk-alice").code).To(Equal(200))
		reqs := h.llm.Requests()
		Expect(reqs).To(HaveLen(3))
		for _, req := range reqs {
			Expect(req.Header.Get("Authorization")).To(BeEmpty(), req.Path)
			Expect(req.Header.Get("X-Api-Key")).To(BeEmpty(), req.Path)
		}
	})
})
