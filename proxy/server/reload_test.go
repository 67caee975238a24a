// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package server_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/proxy/server"
	"github.com/tokenwarden/tokenwarden/test/fakellm"
)

func teamDoc(tpm string) string {
	return keysDoc + `
  limits:
    per_team: {tokens_per_minute: ` + tpm + `}
`
}

var _ = Describe("Hot reload", func() {
	teamLevel := func(h *harness, capacity float64) float64 {
		return h.level(budget.TokensMinute, budget.Team, "research", capacity)
	}

	It("keeps a bucket's level when its parameters did not change", func() {
		h := newHarness(teamDoc("6000"))
		h.llm.Set(fakellm.Behaviour{InputTokens: 3000})
		Expect(h.chat("sk-alice", 10).code).To(Equal(200))
		Expect(h.apply(teamDoc("6000") + "    global: {requests_per_second: 1000}\n")).To(Succeed())
		Expect(teamLevel(h, 6000)).To(BeNumerically("~", 3000, 0.01), "a reload never grants budget")
	})

	It("rebuilds a changed bucket keeping the fraction already drawn down", func() {
		h := newHarness(teamDoc("6000"))
		h.llm.Set(fakellm.Behaviour{InputTokens: 4500})
		Expect(h.chat("sk-alice", 10).code).To(Equal(200))
		Expect(h.apply(teamDoc("12000"))).To(Succeed())
		h.llm.Set(fakellm.Behaviour{Status: 500})
		Expect(h.chat("sk-bob", 1).code).To(Equal(500)) // its hold is released: only the rebuild shows
		Eventually(func() float64 { return teamLevel(h, 12000) }).Should(BeNumerically("~", 3000, 0.01))
	})

	It("settles a hold taken before the reload on the parameters it recorded", func() {
		h := newHarness(teamDoc("6000"))
		h.llm.Set(fakellm.Behaviour{Status: 500, Latency: 200e6}) // each hold is released
		done := make(chan int)
		go func() { done <- h.chat("sk-alice", 3000-chatInput).code }() // holds 3000 of 6000
		Eventually(func() float64 { return teamLevel(h, 6000) }).Should(BeNumerically("~", 3000, 0.01))
		Expect(h.apply(teamDoc("3000"))).To(Succeed()) // half drawn: 1500 of 3000
		doneB := make(chan int)
		go func() { doneB <- h.chat("sk-bob", 1).code }() // rebuilds the bucket, holds chatEstimate(1)
		Eventually(func() float64 { return teamLevel(h, 3000) }).Should(BeNumerically("~", 1500-chatEstimate(1), 0.01))
		Eventually(done).Should(Receive(Equal(500)))
		Eventually(doneB).Should(Receive(Equal(500)))
		// The first release returns its 3000 of 6000, which is 1500 of 3000: whole again.
		Expect(teamLevel(h, 3000)).To(BeNumerically("~", 3000, 0.01))
	})

	It("drops the buckets of a dimension that is gone", func() {
		h := newHarness(teamDoc("6000"))
		Expect(h.chat("sk-alice", 10).code).To(Equal(200))
		_, ok := h.store.Level(budget.Key{Kind: budget.TokensMinute, Dim: budget.Team, ID: "research"})
		Expect(ok).To(BeTrue())
		Expect(h.apply(keysDoc)).To(Succeed())
		_, ok = h.store.Level(budget.Key{Kind: budget.TokensMinute, Dim: budget.Team, ID: "research"})
		Expect(ok).To(BeFalse())
	})

	It("refuses a bad document, counts it, and keeps serving the last good one", func() {
		h := newHarness(teamDoc("100"))
		err := h.apply(teamDoc("100") + "    per_user: {tokens_per_minut: 5}\n")
		Expect(err).To(MatchError(ContainSubstring(`rate_limiting.limits.per_user.tokens_per_minut: unknown field`)))
		err = h.apply(teamDoc("-5"))
		Expect(err).To(MatchError(ContainSubstring("rate_limiting.limits.per_team.tokens_per_minute: must not be negative")))
		Expect(counter(h.m.ConfigReloads.WithLabelValues("failure"))).To(Equal(2.0))
		Expect(h.chat("sk-alice", 500).code).To(Equal(429), "the last good budget of 100 is still enforced")
	})
})

var _ = Describe("Routing and identity", func() {
	It("sends each model to the upstream that serves it", func() {
		other := fakellm.New()
		otherSrv := httptest.NewServer(other)
		DeferCleanup(otherSrv.Close)
		h := newHarness(`
upstreams:
- {name: claude, url: ` + otherSrv.URL + `, models: [claude-x]}
- {name: default, url: UPSTREAM}
api_keys: [{name: alice, key_sha256: HASH(alice)}]
`)
		Expect(h.do("POST", "/v1/messages", "sk-alice", `{"model":"claude-x","max_tokens":5}`).code).To(Equal(200))
		Expect(h.chat("sk-alice", 5).code).To(Equal(200))
		Expect(other.Requests()).To(HaveLen(1))
		Expect(h.llm.Requests()).To(HaveLen(1))
	})

	It("charges a per_model budget only to its model", func() {
		h := newHarness(keysDoc + `
  limits:
    per_model:
      gpt-4o: {tokens_per_minute: 100}
`)
		Expect(h.chat("sk-alice", 200).code).To(Equal(429))
		r := h.chat("sk-alice", 200)
		Expect(r.errorField("error", "details", "token_dimension")).To(Equal("model"))
		Expect(r.errorField("error", "details", "model")).To(Equal("gpt-4o"))
		Expect(h.do("POST", "/v1/chat/completions", "sk-alice", `{"model":"other","max_tokens":200}`).code).To(Equal(200))
	})

	It("believes X-Forwarded-For only from a trusted proxy", func() {
		h := newHarness(`
upstreams: [{name: default, url: UPSTREAM}]
auth: {mode: optional, trusted_proxies: ["127.0.0.1/32"]}
rate_limiting:
  budget_division: {replicas: 1}
  limits:
    per_client: {tokens_per_minute: 6000}
`)
		Expect(h.do("POST", "/v1/chat/completions", "", `{"max_tokens":100}`, "X-Forwarded-For", "203.0.113.7, 127.0.0.1").code).To(Equal(200))
		_, ok := h.store.Level(budget.Key{Kind: budget.TokensMinute, Dim: budget.Client, ID: "203.0.113.7"})
		Expect(ok).To(BeTrue())

		Expect(h.apply(`
upstreams: [{name: default, url: UPSTREAM}]
auth: {mode: optional}
rate_limiting:
  budget_division: {replicas: 1}
  limits:
    per_client: {tokens_per_minute: 6000}
`)).To(Succeed())
		Expect(h.do("POST", "/v1/chat/completions", "", `{"max_tokens":100}`, "X-Forwarded-For", "198.51.100.1").code).To(Equal(200))
		_, ok = h.store.Level(budget.Key{Kind: budget.TokensMinute, Dim: budget.Client, ID: "127.0.0.1"})
		Expect(ok).To(BeTrue(), "an untrusted peer's X-Forwarded-For is ignored")
	})
})

var _ = Describe("The admin listener", func() {
	It("serves metrics, health, readiness and the effective config without key material", func() {
		h := newHarness(keysDoc + `
  limits:
    global: {tokens_per_minute: 1001}
`)
		admin := httptest.NewServer(h.srv.AdminHandler(h.reg))
		DeferCleanup(admin.Close)
		Expect(h.chat("sk-alice", 10).code).To(Equal(200))

		get := func(path string) (int, string) {
			resp, err := http.Get(admin.URL + path)
			Expect(err).NotTo(HaveOccurred())
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			return resp.StatusCode, string(b)
		}
		code, _ := get("/healthz")
		Expect(code).To(Equal(200))
		code, _ = get("/readyz")
		Expect(code).To(Equal(200))
		code, body := get("/admin/effective")
		Expect(code).To(Equal(200))
		Expect(body).NotTo(ContainSubstring(keyHash("sk-alice")))
		var eff server.Effective
		Expect(json.Unmarshal([]byte(body), &eff)).To(Succeed())
		Expect(eff.Divisor).To(Equal(int64(1)))
		Expect(eff.APIKeys).To(ContainElement(server.EffectiveKey{Name: "alice", User: "alice", Team: "research"}))
		Expect(*eff.Limits[0].TokensPerMinute).To(Equal(int64(1001)))

		code, body = get("/metrics")
		Expect(code).To(Equal(200))
		for _, family := range []string{
			"rate_limit_token_budget_tokens_total", "rate_limit_token_budget_period_tokens_total",
			"rate_limit_token_budget_refusals_total", "rate_limit_token_budget_period_refusals_total",
			"tokenwarden_request_duration_seconds", "tokenwarden_upstream_duration_seconds",
			"tokenwarden_config_reloads_total", "tokenwarden_config_generation", "tokenwarden_api_key_tokens_total",
		} {
			Expect(body).To(ContainSubstring(family))
		}
		Expect(testutil.ToFloat64(h.m.Divisor)).To(Equal(1.0))
		Expect(strings.Contains(body, `tokenwarden_budget_allowance_tokens{budget="minute",dimension="global",model=""} 1001`)).To(BeTrue(), body)
	})

	It("publishes the token allowance of each key that has one, and no other key's", func() {
		doc := `
upstreams: [{name: default, url: UPSTREAM}]
api_keys:
- {name: alice, key_sha256: HASH(alice), user: alice, rate_limit_tokens_per_minute: 600}
- {name: bob, key_sha256: HASH(bob), user: bob}
rate_limiting:
  budget_division: {replicas: 2}
`
		h := newHarness(doc)
		allowances := func() int { return testutil.CollectAndCount(h.m.KeyAllowance) }
		Expect(allowances()).To(Equal(1), "only alice has an allowance of her own")
		Expect(testutil.ToFloat64(h.m.KeyAllowance.WithLabelValues("alice", "minute"))).To(Equal(300.0))

		Expect(h.apply(doc + "  limits:\n    per_api_key: {tokens_per_day: 1000}\n")).To(Succeed())
		Expect(allowances()).To(Equal(3), "alice's minute, and each key's day")
		Expect(testutil.ToFloat64(h.m.KeyAllowance.WithLabelValues("bob", "day"))).To(Equal(500.0))

		Expect(h.apply(strings.Replace(doc, ", rate_limit_tokens_per_minute: 600", "", 1))).To(Succeed())
		Expect(allowances()).To(BeZero())
	})

	It("is not ready before the first config", func() {
		srv := server.New(server.Options{Store: budget.NewMemory(budget.SystemClock{}, 10), Metrics: newHarness(keysDoc).m})
		admin := httptest.NewServer(srv.AdminHandler(nil))
		DeferCleanup(admin.Close)
		resp, err := http.Get(admin.URL + "/readyz")
		Expect(err).NotTo(HaveOccurred())
		resp.Body.Close()
		Expect(resp.StatusCode).To(Equal(503))
	})
})
