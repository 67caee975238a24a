// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package server_test

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/test/fakellm"
	"github.com/tokenwarden/tokenwarden/test/redisserver"
)

var _ = Describe("Rules at the proxy", func() {
	DescribeTable("a refusal by the caller's own rule names it, with its level and its header family",
		func(f family, limitHeader string) {
			h := newHarness(keysDoc + `
  rules:
  - {name: key-input, dimension: api_key, amount: input_tokens, windows: [{limit: 60, rolling: {period: minute}}]}
  - {name: research-tokens, dimension: team, subjects: [research], windows: [{limit: 100000, rolling: {period: minute}}]}
`)
			h.llm.Set(fakellm.Behaviour{InputTokens: 55, OutputTokens: 5})
			ok := f.ask(h, "sk-alice", 10)
			Expect(ok.code).To(Equal(200))
			Expect(ok.header.Get(limitHeader)).To(Equal("60"), "the key's own input budget, in its header family")
			r := f.ask(h, "sk-alice", 10)
			Expect(r.code).To(Equal(429))
			Expect(r.errorField("error", "limit_type")).To(Equal("token_budget"))
			Expect(r.errorField("error", "details", "rule")).To(Equal("key-input"))
			Expect(r.errorField("error", "details", "amount")).To(Equal("input_tokens"))
			Expect(r.errorField("error", "details", "window")).To(Equal("minute"))
			Expect(r.errorField("error", "details", "remaining")).To(BeNumerically("==", 5))
			Expect(r.header.Get("X-Ratelimit-Input-Tokens-Remaining")).To(Equal("5"))
			Expect(r.errorField("error", "message")).To(ContainSubstring(`your budget "key-input" (minute window) exceeded`))
		},
		Entry("OpenAI shape", openAIChat, "X-Ratelimit-Input-Tokens-Limit"),
		Entry("Anthropic shape", anthropicMessages, "Anthropic-Ratelimit-Input-Tokens-Limit"),
	)

	It("never names a shared rule nor tells its level", func() {
		h := newHarness(keysDoc + `
  rules:
  - {name: acme/fleet-cap, dimension: global, windows: [{limit: 50, rolling: {period: minute}}]}
`)
		r := h.chat("sk-alice", 100)
		Expect(r.code).To(Equal(429))
		Expect(r.errorField("error", "details")).NotTo(HaveKey("rule"))
		Expect(r.errorField("error", "details")).NotTo(HaveKey("remaining"))
		Expect(r.errorField("error", "details")).NotTo(HaveKey("capacity"))
		Expect(r.errorField("error", "details", "dimension")).To(Equal("global"))
		Expect(r.errorField("error", "details", "reason")).To(Equal("larger_than_budget"))
		Expect(string(r.body)).NotTo(ContainSubstring("fleet-cap"))
		Expect(r.header.Get("X-Ratelimit-Tokens-Remaining")).To(BeEmpty())
		Expect(counter(h.m.RuleRequests.WithLabelValues("acme/fleet-cap", "minute", "refused"))).To(Equal(1.0))
	})

	It("admits a request a warn rule would refuse, with a warning header, and counts it", func() {
		h := newHarness(keysDoc + `
  rules:
  - {name: watch-keys, dimension: api_key, action: warn, windows: [{limit: 50, rolling: {period: minute}}]}
`)
		first := h.chat("sk-alice", 10)
		Expect(first.code).To(Equal(200))
		Expect(first.header.Values("X-Tokenwarden-Budget-Warning")).To(BeEmpty())
		second := h.chat("sk-alice", 10) // 31 reserved, 20 left
		Expect(second.code).To(Equal(200), "warn never refuses")
		Expect(second.header.Get("X-Tokenwarden-Budget-Warning")).To(Equal("watch-keys;window=minute"))
		Expect(counter(h.m.RuleWarnings.WithLabelValues("watch-keys", "minute"))).To(Equal(1.0))
		Expect(counter(h.m.RuleAmount.WithLabelValues("watch-keys", "minute", "reserved"))).To(Equal(chatEstimate(10)), "only the first request took from it")
		Expect(counter(h.m.RuleAmount.WithLabelValues("watch-keys", "minute", "refunded"))).To(Equal(chatEstimate(10)-30), "settled on 10 input and 20 output tokens")
		Expect(counter(h.m.RuleRequests.WithLabelValues("watch-keys", "minute", "admitted"))).To(Equal(1.0))
		Expect(h.llm.Requests()).To(HaveLen(2))
	})

	It("publishes one level per rule window, whichever key drew on it last, and drops it with the rule", func() {
		h := newHarness(keysDoc + `
  rules:
  - {name: key-minute, dimension: api_key, windows: [{limit: 1000, rolling: {period: minute}}]}
`)
		Expect(h.chat("sk-alice", 10).code).To(Equal(200))
		Expect(counter(h.m.RuleUsed.WithLabelValues("key-minute", "minute"))).To(BeNumerically("~", 30.0/1000, 1e-3),
			"alice's 30 tokens once settled, in a bucket of 1,000")
		Expect(h.chat("sk-alice", 10).code).To(Equal(200))
		Expect(h.chat("sk-bob", 400).code).To(Equal(200))
		Expect(counter(h.m.RuleUsed.WithLabelValues("key-minute", "minute"))).To(BeNumerically("~", 30.0/1000, 1e-3),
			"bob's bucket, the last one drawn on (alice's holds 60)")
		Expect(testutil.CollectAndCount(h.m.RuleUsed)).To(Equal(1), "one series for the rule window, not one per key")
		Expect(counter(h.m.RuleLimit.WithLabelValues("key-minute", "minute", "tokens"))).To(Equal(1000.0))
		Expect(h.apply(keysDoc)).To(Succeed())
		Expect(testutil.CollectAndCount(h.m.RuleUsed)).To(Equal(0), "the rule is gone, and its level with it")
		Expect(testutil.CollectAndCount(h.m.RuleLimit)).To(Equal(0))
	})

	It("counts cached input tokens at cached_input_weight", func() {
		h := newHarness(keysDoc + `
  cached_input_weight: 0.25
  limits:
    per_api_key: {tokens_per_minute: 1000}
`)
		h.llm.Set(fakellm.Behaviour{InputTokens: 500, OutputTokens: 20, CachedTokens: 400})
		Expect(h.chat("sk-alice", 100).code).To(Equal(200))
		// 100 uncached, 400 cached at a quarter, 20 output.
		Expect(h.level(budget.TokensMinute, budget.APIKey, "alice", 1000)).To(Equal(1000.0 - 100 - 100 - 20))
		h.llm.Set(fakellm.Behaviour{InputTokens: 500, OutputTokens: 20, CachedTokens: 400})
		Expect(h.do("POST", "/v1/messages", "sk-alice", `{"model":"claude","max_tokens":100,"messages":[{"role":"user","content":"hi"}]}`).code).To(Equal(200))
		Expect(h.level(budget.TokensMinute, budget.APIKey, "alice", 1000)).To(Equal(1000.0-2*220), "Anthropic's cache_read_input_tokens alike")
	})

	It("lists each rule window with this replica's share, and drops a removed rule's buckets on reload", func() {
		doc := strings.Replace(keysDoc, "replicas: 1", "replicas: 2", 1)
		h := newHarness(doc + `
  rules:
  - {name: key-minute, dimension: api_key, windows: [{limit: 6000, rolling: {period: minute, burst_seconds: 20}}]}
`)
		Expect(h.chat("sk-alice", 10).code).To(Equal(200))
		key := budget.Key{Kind: budget.Rolling, Dim: budget.APIKey, ID: "alice", Rule: "key-minute"}
		_, ok := h.store.Level(key)
		Expect(ok).To(BeTrue())
		eff, _ := h.srv.Effective()
		Expect(eff.Rules).To(ConsistOf(budget.EffectiveRule{Rule: "key-minute", Window: "minute", Dimension: "api_key", Amount: "tokens",
			Capacity: 1000, Rate: 50, SharedCapacity: 2000}), "3,000 a minute for each of two replicas, holding 20 s")
		Expect(h.apply(doc)).To(Succeed())
		_, ok = h.store.Level(key)
		Expect(ok).To(BeFalse(), "the rule is gone, and its buckets with it")
	})

	Describe("on Redis", func() {
		var rs *redisserver.Server
		BeforeEach(func() { rs = redisserver.Start(GinkgoT()) })

		costDoc := func(url string) string {
			return fmt.Sprintf(`
upstreams: [{name: default, url: UPSTREAM}]
models:
- {name: gpt-4o, price: {input: 1000, output: 1000, cached_input: 500}}
api_keys:
- {name: alice, key_sha256: HASH(alice), user: alice, team: research}
- {name: bob, key_sha256: HASH(bob), user: bob, team: research}
rate_limiting:
  storage: redis
  redis: {url: "%s", fallback_to_memory: true}
  limits:
    per_api_key: {tokens_per_minute: 100000}
  rules:
  - {name: alice-dollars, dimension: api_key, subjects: [alice], models: [gpt-4o], amount: cost, windows: [{limit: 1, calendar: {every: month, time_zone: Europe/Berlin}}]}
`, url)
		}

		It("reports a cost budget's dollars, spends on the reported usage, and refuses at the dollar", func() {
			h := newHarness(keysDoc)
			p := newRedisProxy(h, rs.URL(), fmt.Sprint("c", redisPrefixes.Add(1)), true, costDoc(rs.URL()))
			ask := via(h, p.url)
			h.llm.Set(fakellm.Behaviour{InputTokens: 300, OutputTokens: 100, CachedTokens: 200}) // $0.30
			r := ask("sk-alice", 100)
			Expect(r.code).To(Equal(200))
			Expect(r.header.Get("X-Tokenwarden-Budget-Cost-Limit")).To(Equal("1"))
			remaining, err := strconv.ParseFloat(r.header.Get("X-Tokenwarden-Budget-Cost-Remaining"), 64)
			Expect(err).NotTo(HaveOccurred())
			Expect(remaining).To(BeNumerically("~", 1-(chatEstimate(100))/1000, 1e-9), "the reservation, priced")
			Eventually(func() float64 { return counter(p.m.Spend.WithLabelValues("gpt-4o")) }).Should(BeNumerically("~", 0.3, 1e-9))
			for range 2 {
				Eventually(func() float64 { return counter(p.m.Settlements.WithLabelValues("settled")) }).Should(BeNumerically(">=", 1))
				Expect(ask("sk-alice", 100).code).To(Equal(200))
			}
			// $0.90 spent once the settlements land: the next reservation of $0.121 does
			// not fit in the $0.10 left.
			Eventually(func() int { return ask("sk-alice", 100).code }).Should(Equal(429))
			refused := ask("sk-alice", 100)
			Expect(refused.errorField("error", "limit_type")).To(Equal("cost_budget"))
			Expect(refused.errorField("error", "details", "rule")).To(Equal("alice-dollars"))
			Expect(refused.errorField("error", "details", "window")).To(Equal("calendar_month"))
			Expect(refused.errorField("error", "message")).To(ContainSubstring("is spent until the window resets"))
			// The gauges the near-limit table and the run-out alert read: the fleet's
			// level the last request saw, the limit, and the window's reset.
			Expect(counter(p.m.RuleUsed.WithLabelValues("alice-dollars", "calendar_month"))).To(BeNumerically(">", 0.5))
			Expect(counter(p.m.RuleLimit.WithLabelValues("alice-dollars", "calendar_month", "cost"))).To(Equal(1.0))
			wait, err := strconv.ParseInt(refused.header.Get("Retry-After"), 10, 64)
			Expect(err).NotTo(HaveOccurred())
			Expect(counter(p.m.RuleReset.WithLabelValues("alice-dollars", "calendar_month"))).To(BeNumerically("~", float64(time.Now().Unix()+wait), 5),
				"the month's end, as Retry-After tells it")
			Expect(testutil.CollectAndCount(p.m.RuleReset)).To(Equal(1), "no reset series for a rolling window")
			Expect(ask("sk-bob", 100).code).To(Equal(200), "bob has no cost budget")
		})

		It("answers 503 for a durable rule while Redis is unreachable, though the fallback admits the rest", func() {
			h := newHarness(keysDoc)
			p := newRedisProxy(h, rs.URL(), fmt.Sprint("c", redisPrefixes.Add(1)), true, costDoc(rs.URL()))
			ask := via(h, p.url)
			Expect(ask("sk-alice", 10).code).To(Equal(200))
			Expect(rs.Kill()).To(Succeed())
			r := ask("sk-alice", 10)
			Expect(r.code).To(Equal(503))
			Expect(r.errorField("error", "code")).To(Equal("budget_store_unavailable"))
			Expect(r.header.Get("Retry-After")).To(Equal("5"))
			Expect(counter(p.m.DurableRefusals.WithLabelValues("api_key"))).To(BeNumerically(">=", 1))
			Expect(ask("sk-bob", 10).code).To(Equal(200), "bob's rolling budgets fall back to the replica's share")
		})
	})
})
