// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package server_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/proxy/server"
	"github.com/tokenwarden/tokenwarden/test/fakellm"
)

// registry is a proxy whose model gpt-4o is served by primary, then secondary (two
// fake backends of their own); h.llm is the catch-all's backend.
type registry struct {
	*harness
	primary, secondary *fakellm.Server
	// doc is the document applied, with the backends' URLs.
	doc string
}

const registryDoc = `
upstreams:
- {name: primary, url: PRIMARY, provider: openai}
- {name: secondary, url: SECONDARY}
- {name: claude, url: PRIMARY, provider: anthropic}
- {name: rest, url: UPSTREAM}
models:
- name: gpt-4o
  context_window: 1000
  max_output_tokens: 300
  upstreams:
  - {upstream: primary}
  - {upstream: secondary, provider_model: gpt-4o-2024-08-06}
- name: sonnet
  context_window: 1000
  upstreams: [{upstream: claude}, {upstream: secondary}]
api_keys:
- {name: alice, key_sha256: HASH(alice)}
rate_limiting:
  budget_division: {replicas: 1}
  limits:
    per_api_key: {tokens_per_minute: 100000}
`

func newRegistry(extra string) *registry {
	r := &registry{primary: fakellm.New(), secondary: fakellm.New()}
	p, s := httptest.NewServer(r.primary), httptest.NewServer(r.secondary)
	DeferCleanup(p.Close)
	DeferCleanup(s.Close)
	r.doc = strings.NewReplacer("PRIMARY", p.URL, "SECONDARY", s.URL).Replace(registryDoc + extra)
	r.harness = newHarness(r.doc)
	return r
}

// keyLevel is alice's minute bucket.
func (r *registry) keyLevel() float64 {
	return r.level(budget.TokensMinute, budget.APIKey, "alice", 100000)
}

var _ = Describe("The context-window pre-check", func() {
	long := strings.Repeat("word ", 2400) // 2,400 words: at least 2,400 tokens by the lower bound

	DescribeTable("refuses, in the route's shape and before any budget or upstream, a request that cannot fit",
		func(path, body string, anthropic bool, want string) {
			r := newRegistry("")
			rep := r.do("POST", path, "sk-alice", body)
			Expect(rep.code).To(Equal(400))
			if anthropic {
				Expect(rep.errorField("type")).To(Equal("error"))
				Expect(rep.errorField("error", "type")).To(Equal("invalid_request_error"))
			} else {
				Expect(rep.errorField("error", "code")).To(Equal("context_length_exceeded"))
				Expect(rep.errorField("error", "type")).To(Equal("invalid_request_error"))
			}
			Expect(rep.errorField("error", "message")).To(ContainSubstring(want))
			Expect(r.primary.Requests()).To(BeEmpty())
			Expect(r.secondary.Requests()).To(BeEmpty())
			Expect(r.keyLevel()).To(Equal(100000.0), "nothing was reserved")
		},
		Entry("OpenAI chat: input plus the output asked for",
			"/v1/chat/completions", `{"model":"gpt-4o","max_tokens":200,"messages":[{"role":"user","content":"`+strings.Repeat("word ", 2000)+`"}]}`, false,
			"input of at least 2001 tokens plus the 200 output tokens it asks for is 2201, over the context window of 1000 tokens of model \"gpt-4o\""),
		Entry("OpenAI chat without an output cap: input alone",
			"/v1/chat/completions", `{"model":"gpt-4o","messages":[{"role":"user","content":"`+long+`"}]}`, false,
			"over the context window of 1000 tokens"),
		Entry("OpenAI completions", "/v1/completions", `{"model":"gpt-4o","max_tokens":100,"prompt":"`+long+`"}`, false,
			"over the context window of 1000 tokens"),
		Entry("OpenAI Responses", "/v1/responses", `{"model":"gpt-4o","max_output_tokens":100,"input":"`+long+`"}`, false,
			"over the context window of 1000 tokens"),
		Entry("OpenAI chat asking for more output than the model generates",
			"/v1/chat/completions", `{"model":"gpt-4o","max_tokens":301,"messages":[]}`, false,
			"generates at most 300 (max_output_tokens)"),
		Entry("Anthropic messages", "/v1/messages", `{"model":"sonnet","max_tokens":100,"messages":[{"role":"user","content":"`+long+`"}]}`, true,
			"over the context window of 1000 tokens of model \"sonnet\""),
	)

	It("lets through what fits, and does not check a model without a window; refusals are counted per model", func() {
		r := newRegistry("")
		rep := r.do("POST", "/v1/chat/completions", "sk-alice", `{"model":"gpt-4o","max_tokens":200,"messages":[{"role":"user","content":"`+strings.Repeat("word ", 700)+`"}]}`)
		Expect(rep.code).To(Equal(200), string(rep.body))
		rep = r.do("POST", "/v1/chat/completions", "sk-alice", `{"model":"llama","messages":[{"role":"user","content":"`+long+long+`"}]}`)
		Expect(rep.code).To(Equal(200), "a model with no declared window is not pre-checked")
		Expect(r.do("POST", "/v1/chat/completions", "sk-alice", `{"model":"gpt-4o","messages":[{"role":"user","content":"`+long+`"}]}`).code).To(Equal(400))
		Expect(counter(r.m.Providers.ContextRefusals.WithLabelValues("gpt-4o", "context_window"))).To(Equal(1.0))
	})
})

var _ = Describe("Failover", func() {
	chat := func(r *registry) reply {
		GinkgoHelper()
		return r.chat("sk-alice", 10)
	}

	It("moves a request to the next upstream after a 5xx, names the one that served, and settles once on its usage", func() {
		r := newRegistry("")
		r.primary.Set(fakellm.Behaviour{Status: 503})
		r.secondary.Set(fakellmUsage(40, 7))
		rep := chat(r)
		Expect(rep.code).To(Equal(200))
		Expect(rep.header.Get(server.UpstreamHeader)).To(Equal("secondary"))
		Expect(r.primary.Requests()).To(HaveLen(1))
		Expect(r.secondary.Requests()).To(HaveLen(1))
		Expect(string(r.secondary.Requests()[0].Body)).To(ContainSubstring(`"model":"gpt-4o-2024-08-06"`), "the provider's own model name")
		Expect(counter(r.m.Settlements.WithLabelValues("settled"))).To(Equal(1.0))
		Expect(counter(r.m.Settlements.WithLabelValues("released"))).To(Equal(0.0))
		Expect(r.keyLevel()).To(Equal(100000.0-47), "charged the serving attempt's usage, once")
		Expect(counter(r.m.Providers.Failovers.WithLabelValues("gpt-4o"))).To(Equal(1.0))
	})

	It("fails over on a connection error and on an upstream that does not answer in time", func() {
		r := newRegistry("")
		primaryURL := strings.SplitN(strings.SplitN(r.doc, "{name: primary, url: ", 2)[1], ",", 2)[0]
		Expect(r.apply(strings.Replace(r.doc, primaryURL, "http://127.0.0.1:1", 1))).To(Succeed())
		rep := chat(r)
		Expect(rep.code).To(Equal(200))
		Expect(rep.header.Get(server.UpstreamHeader)).To(Equal("secondary"))

		Expect(r.apply(strings.Replace(r.doc, "{name: primary, url: "+primaryURL+", provider: openai}",
			"{name: primary, url: "+primaryURL+", provider: openai, timeout_seconds: 1}", 1))).To(Succeed())
		r.primary.Set(fakellm.Behaviour{Latency: 3 * time.Second})
		rep = chat(r)
		Expect(rep.code).To(Equal(200))
		Expect(rep.header.Get(server.UpstreamHeader)).To(Equal("secondary"), "the primary's headers did not come within its timeout")
		Expect(counter(r.m.Settlements.WithLabelValues("settled"))).To(Equal(2.0))
	})

	It("passes a caller's 4xx mistake through without failing over, and never opens the breaker for it", func() {
		r := newRegistry("")
		r.primary.Set(fakellm.Behaviour{Status: 400})
		for range 8 {
			Expect(chat(r).code).To(Equal(400))
		}
		Expect(r.secondary.Requests()).To(BeEmpty())
		Expect(r.primary.Requests()).To(HaveLen(8), "the breaker stayed closed")
	})

	It("never replays a stream that began: a cut after the first byte reaches the client as a cut", func() {
		r := newRegistry("")
		r.primary.Set(fakellm.Behaviour{InputTokens: 5, OutputTokens: 10, CutAfter: 2})
		resp := r.post("/v1/chat/completions", "sk-alice", `{"model":"gpt-4o","stream":true,"max_tokens":10,"messages":[]}`)
		defer resp.Body.Close()
		Expect(resp.StatusCode).To(Equal(200))
		Expect(resp.Header.Get(server.UpstreamHeader)).To(Equal("primary"))
		_, _ = io.ReadAll(resp.Body)
		Expect(r.secondary.Requests()).To(BeEmpty())
	})

	It("opens the primary's breaker after five failures, skips it for ten seconds, then probes it", func() {
		r := newRegistry("")
		r.primary.Set(fakellm.Behaviour{Status: 500})
		for range 5 {
			Expect(chat(r).header.Get(server.UpstreamHeader)).To(Equal("secondary"))
		}
		Expect(r.primary.Requests()).To(HaveLen(5))
		Expect(chat(r).code).To(Equal(200))
		Expect(r.primary.Requests()).To(HaveLen(5), "the open breaker keeps the primary out")
		Expect(gauge(r, `tokenwarden_upstream_breaker_state{state="open",upstream="primary"}`)).To(Equal(1.0))
		Expect(r.srv.HealthReport()).To(Equal(`[{"upstream":"claude","breaker":"closed"},{"upstream":"primary","breaker":"open"},{"upstream":"secondary","breaker":"closed"}]`),
			"what the replica reports to the TokenProxy's status")
		r.primary.Set(fakellmUsage(10, 20))
		r.clock.Advance(10 * time.Second)
		for range 3 {
			Expect(chat(r).header.Get(server.UpstreamHeader)).To(Equal("primary"), "a half-open probe")
		}
		Expect(gauge(r, `tokenwarden_upstream_breaker_state{state="closed",upstream="primary"}`)).To(Equal(1.0))
	})

	It("forgets the health of an upstream a reload removes: brought back, it starts closed", func() {
		r := newRegistry("")
		r.primary.Set(fakellm.Behaviour{Status: 500})
		for range 5 {
			chat(r)
		}
		Expect(r.srv.HealthReport()).To(ContainSubstring(`{"upstream":"primary","breaker":"open"}`))
		var kept []string
		for _, line := range strings.Split(r.doc, "\n") {
			if !strings.Contains(line, "name: primary,") && !strings.Contains(line, "{upstream: primary}") {
				kept = append(kept, line)
			}
		}
		without := strings.Join(kept, "\n")
		Expect(strings.Count(r.doc, "\n") - strings.Count(without, "\n")).To(Equal(2))
		Expect(r.apply(without)).To(Succeed())
		Expect(r.srv.HealthReport()).NotTo(ContainSubstring("primary"))
		Expect(r.apply(r.doc)).To(Succeed())
		Expect(r.srv.HealthReport()).To(ContainSubstring(`{"upstream":"primary","breaker":"closed"}`))
	})

	It("cools a credential on a 429 for its Retry-After, and answers 503 with the earliest recovery when every upstream is out", func() {
		r := newRegistry("")
		r.primary.Set(fakellm.Behaviour{Status: 429, Header: map[string]string{"Retry-After": "20"}})
		r.secondary.Set(fakellm.Behaviour{Status: 429, Header: map[string]string{"Retry-After-Ms": "8000"}})
		rep := chat(r)
		Expect(rep.code).To(Equal(429), "the last upstream's own answer")
		rep = chat(r)
		Expect(rep.code).To(Equal(503))
		Expect(rep.header.Get("Retry-After")).To(Equal("8"))
		Expect(rep.errorField("error", "code")).To(Equal("upstreams_unavailable"))
		Expect(rep.errorField("error", "message")).NotTo(ContainSubstring("429"), "no other caller's failure detail")
		Expect(r.primary.Requests()).To(HaveLen(1))
		Expect(r.secondary.Requests()).To(HaveLen(1))
		Expect(r.keyLevel()).To(Equal(100000.0), "a 503 before dispatch holds nothing")

		r.secondary.Set(fakellmUsage(10, 20))
		r.clock.Advance(8 * time.Second)
		Expect(chat(r).header.Get(server.UpstreamHeader)).To(Equal("secondary"), "the primary still cools")
		r.primary.Set(fakellmUsage(10, 20))
		r.clock.Advance(12 * time.Second)
		Expect(chat(r).header.Get(server.UpstreamHeader)).To(Equal("primary"))
		Expect(gauge(r, `tokenwarden_upstream_cooldown_seconds_total{upstream="primary"}`)).To(Equal(20.0))
	})

	It("fails over within the route's API family only", func() {
		r := newRegistry("")
		rep := r.do("POST", "/v1/chat/completions", "sk-alice", `{"model":"sonnet","max_tokens":5,"messages":[]}`)
		Expect(rep.code).To(Equal(200))
		Expect(rep.header.Get(server.UpstreamHeader)).To(Equal("secondary"), "claude speaks only the Anthropic API")
		rep = r.do("POST", "/v1/messages", "sk-alice", `{"model":"sonnet","max_tokens":5,"messages":[]}`)
		Expect(rep.header.Get(server.UpstreamHeader)).To(Equal("claude"))
		rep = r.do("POST", "/v1/messages", "sk-alice", `{"model":"gpt-4o","max_tokens":5,"messages":[]}`)
		Expect(rep.header.Get(server.UpstreamHeader)).To(Equal("secondary"), "primary speaks only the OpenAI API")
		Expect(r.primary.Requests()).To(HaveLen(1), "only the Anthropic route's claude request reached the primary's backend")

		Expect(r.apply(strings.Replace(r.doc, "  - {upstream: secondary, provider_model: gpt-4o-2024-08-06}\n", "", 1))).To(Succeed())
		rep = r.do("POST", "/v1/messages", "sk-alice", `{"model":"gpt-4o","max_tokens":5,"messages":[]}`)
		Expect(rep.code).To(Equal(404))
		Expect(rep.errorField("error", "message")).To(Equal(`no upstream of the model "gpt-4o" speaks the Anthropic API of this route`))
	})
})

// gauge reads one sample of the proxy's registry by its name and labels as the text
// exposition writes them.
func gauge(r *registry, sample string) float64 {
	GinkgoHelper()
	mfs, err := r.reg.Gather()
	Expect(err).NotTo(HaveOccurred())
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			s := mf.GetName() + "{"
			for i, l := range m.GetLabel() {
				if i > 0 {
					s += ","
				}
				s += l.GetName() + `="` + l.GetValue() + `"`
			}
			s += "}"
			if s == sample {
				if m.Gauge != nil {
					return m.GetGauge().GetValue()
				}
				return m.GetCounter().GetValue()
			}
		}
	}
	Fail("no sample " + sample)
	return 0
}

var _ = Describe("The registry on the admin listener", func() {
	getJSON := func(url string, method string, out any) int {
		GinkgoHelper()
		req, err := http.NewRequest(method, url, nil)
		Expect(err).NotTo(HaveOccurred())
		resp, err := http.DefaultClient.Do(req)
		Expect(err).NotTo(HaveOccurred())
		defer resp.Body.Close()
		if resp.StatusCode == 200 {
			Expect(json.NewDecoder(resp.Body).Decode(out)).To(Succeed())
		}
		return resp.StatusCode
	}

	It("shows each model's values with where they came from, and its upstreams in order with their health", func() {
		r := newRegistry("")
		r.primary.Set(fakellm.Behaviour{Status: 429, Header: map[string]string{"Retry-After": "30"}})
		Expect(r.chat("sk-alice", 10).code).To(Equal(200))
		admin := httptest.NewServer(r.srv.AdminHandler(r.reg))
		DeferCleanup(admin.Close)
		var e server.Effective
		Expect(getJSON(admin.URL+"/admin/effective", "GET", &e)).To(Equal(200))
		Expect(e.Models).To(HaveLen(2))
		m := e.Models[0]
		Expect(m.Name).To(Equal("gpt-4o"))
		Expect(m.ContextWindow).To(Equal(server.EffectiveValue{Value: 1000.0, From: "models[0].context_window"}))
		Expect(m.Price.From).To(HavePrefix("unset"))
		Expect(m.Upstreams).To(HaveLen(2))
		Expect(m.Upstreams[0].Upstream).To(Equal("primary"))
		Expect(m.Upstreams[0].From).To(Equal("models[0].upstreams[0]"))
		Expect(m.Upstreams[0].CoolingUntil).NotTo(BeNil(), "its credential cools after the 429")
		Expect(*m.Upstreams[0].CoolingUntil).To(Equal(r.clock.Now().Add(30 * time.Second)))
		Expect(m.Upstreams[1].ProviderModel).To(Equal("gpt-4o-2024-08-06"))
		Expect(m.Upstreams[1].Breaker).To(Equal("closed"))
	})

	It("probes an upstream with a one-token call of its model and records the answer in its health", func() {
		r := newRegistry("")
		admin := httptest.NewServer(r.srv.AdminHandler(r.reg))
		DeferCleanup(admin.Close)
		r.secondary.Set(fakellm.Behaviour{Status: 429, Header: map[string]string{"Retry-After": "12"}})
		var p server.ProbeResult
		Expect(getJSON(admin.URL+"/admin/upstreams/secondary/probe", "POST", &p)).To(Equal(200))
		Expect(p.Status).To(Equal(429))
		Expect(p.Model).To(Equal("gpt-4o-2024-08-06"))
		Expect(*p.CoolingUntil).To(Equal(r.clock.Now().Add(12 * time.Second)))
		Expect(string(r.secondary.Requests()[0].Body)).To(ContainSubstring(`"max_tokens":1`))
		Expect(getJSON(admin.URL+"/admin/upstreams/nowhere/probe", "POST", &p)).To(Equal(404))
	})
})

var _ = Describe("Budget-aware fallback", func() {
	const fallbackDoc = `
upstreams:
- {name: primary, url: PRIMARY}
- {name: secondary, url: SECONDARY}
models:
- {name: gpt-4o, upstreams: [{upstream: primary}]}
- {name: gpt-4o-mini, context_window: 100000, upstreams: [{upstream: secondary}]}
api_keys:
- {name: alice, key_sha256: HASH(alice)}
- {name: bob, key_sha256: HASH(bob)}
rate_limiting:
  budget_division: {replicas: 1}
  rules:
  - name: big-model
    dimension: model
    subjects: [gpt-4o]
    windows: [{limit: 100, rolling: {period: minute}}]
    fallback_model: gpt-4o-mini
  - name: small-model
    dimension: model
    subjects: [gpt-4o-mini]
    windows: [{limit: 100000, rolling: {period: minute}}]
  - name: bob-tokens
    dimension: api_key
    subjects: [bob]
    windows: [{limit: 150, rolling: {period: minute}}]
`
	newFallback := func() *registry {
		r := &registry{primary: fakellm.New(), secondary: fakellm.New()}
		p, s := httptest.NewServer(r.primary), httptest.NewServer(r.secondary)
		DeferCleanup(p.Close)
		DeferCleanup(s.Close)
		r.harness = newHarness(strings.NewReplacer("PRIMARY", p.URL, "SECONDARY", s.URL).Replace(fallbackDoc))
		return r
	}

	It("serves a request its model's budget refuses with the cheaper model, charged to that model's budget, and says so", func() {
		r := newFallback()
		r.secondary.Set(fakellmUsage(30, 12))
		rep := r.chat("sk-alice", 200)
		Expect(rep.code).To(Equal(200), string(rep.body))
		Expect(rep.header.Get(server.FallbackHeader)).To(Equal("fallback(gpt-4o -> gpt-4o-mini, budget)"))
		Expect(rep.header.Get(server.UpstreamHeader)).To(Equal("secondary"))
		Expect(r.primary.Requests()).To(BeEmpty())
		Expect(string(r.secondary.Requests()[0].Body)).To(ContainSubstring(`"model":"gpt-4o-mini"`))
		net := func(rule string) float64 {
			return counter(r.m.RuleAmount.WithLabelValues(rule, "minute", "reserved")) - counter(r.m.RuleAmount.WithLabelValues(rule, "minute", "refunded"))
		}
		Expect(net("small-model")).To(Equal(42.0), "the fallback model's budget is charged the usage")
		Expect(net("big-model")).To(Equal(0.0))
		Expect(counter(r.m.Providers.Fallbacks.WithLabelValues("gpt-4o", "gpt-4o-mini"))).To(Equal(1.0))
		Expect(counter(r.m.Settlements.WithLabelValues("settled"))).To(Equal(1.0))
	})

	It("never lifts an identity's budget: a tenant out of its own budget stays refused", func() {
		r := newFallback()
		rep := r.chat("sk-bob", 200)
		Expect(rep.code).To(Equal(429))
		Expect(rep.header.Get(server.FallbackHeader)).To(BeEmpty())
		Expect(r.primary.Requests()).To(BeEmpty())
		Expect(r.secondary.Requests()).To(BeEmpty())
	})

	It("is refused on a rule that is not model-scoped, naming the field", func() {
		r := newFallback()
		err := r.apply(strings.Replace(fallbackDoc, "    subjects: [bob]\n", "    subjects: [bob]\n    fallback_model: gpt-4o-mini\n", 1))
		Expect(err).To(MatchError(ContainSubstring("rate_limiting.rules[2].fallback_model: only a rule of dimension model without count_by may fall back")))
	})
})

var _ = Describe("A rule by provider when a request fails over", func() {
	It("charges the upstream that serves the request, not the one that failed before its answer began", func() {
		r := newRegistry(`  rules:
  - {name: per-upstream, dimension: global, count_by: provider, windows: [{limit: 100000, rolling: {period: minute}}]}
  - {name: only-secondary, dimension: global, amount: requests, applies_when: {provider: [secondary]}, windows: [{limit: 1, rolling: {period: minute}}]}
`)
		r.primary.Set(fakellm.Behaviour{Status: 503})
		r.secondary.Set(fakellmUsage(40, 10))
		Expect(r.chat("sk-alice", 100).code).To(Equal(200))
		Expect(r.primary.Requests()).To(HaveLen(1))
		Expect(r.secondary.Requests()).To(HaveLen(1), "the secondary served it")

		_, a := explained(r.harness, "api_key=alice&model=gpt-4o&upstream=primary")
		Expect(*budgetOf(a, "per-upstream").Remaining).To(Equal(100000.0), "the failed upstream's charge is released")
		_, a = explained(r.harness, "api_key=alice&model=gpt-4o&upstream=secondary")
		Expect(budgetOf(a, "per-upstream").By).To(Equal("secondary"))
		Expect(*budgetOf(a, "per-upstream").Remaining).To(Equal(100000.0-50), "the serving upstream's counter holds the 50 tokens used")
		Expect(*budgetOf(a, "only-secondary").Remaining).To(BeNumerically("<", 1), "the serving upstream's rule counts the request")
		Expect(r.keyLevel()).To(Equal(100000.0-50), "the key's budget is charged once")

		rep := r.chat("sk-alice", 100)
		Expect(rep.code).To(Equal(429), "the secondary's rule refuses the next request that would go to it")
		Expect(counter(r.m.RuleRequests.WithLabelValues("only-secondary", "minute", "refused"))).To(Equal(1.0), string(rep.body))
		Expect(r.secondary.Requests()).To(HaveLen(1), "nothing more reached the secondary")
		Expect(r.keyLevel()).To(Equal(100000.0-50), "the refused request holds nothing")
	})
})

var _ = Describe("A budget's fallback model when a request fails over", func() {
	It("serves a request the serving upstream's budget refuses at its admission again with the fallback model, as a first admission would", func() {
		r := &registry{primary: fakellm.New(), secondary: fakellm.New()}
		p, s := httptest.NewServer(r.primary), httptest.NewServer(r.secondary)
		DeferCleanup(p.Close)
		DeferCleanup(s.Close)
		r.harness = newHarness(strings.NewReplacer("PRIMARY", p.URL, "SECONDARY", s.URL).Replace(`
upstreams:
- {name: primary, url: PRIMARY}
- {name: secondary, url: SECONDARY}
- {name: small, url: UPSTREAM}
models:
- {name: gpt-4o, upstreams: [{upstream: primary}, {upstream: secondary}]}
- {name: gpt-4o-mini, upstreams: [{upstream: small}]}
api_keys:
- {name: alice, key_sha256: HASH(alice)}
rate_limiting:
  budget_division: {replicas: 1}
  limits:
    per_api_key: {tokens_per_minute: 100000}
  rules:
  - name: big-on-secondary
    dimension: model
    subjects: [gpt-4o]
    applies_when: {provider: [secondary]}
    windows: [{limit: 100, rolling: {period: minute}}]
    fallback_model: gpt-4o-mini
`))
		r.primary.Set(fakellm.Behaviour{Status: 503})
		r.llm.Set(fakellmUsage(30, 12))
		rep := r.chat("sk-alice", 200)
		Expect(rep.code).To(Equal(200), "the secondary's budget refused gpt-4o after the failover: %s", rep.body)
		Expect(rep.header.Get(server.FallbackHeader)).To(Equal("fallback(gpt-4o -> gpt-4o-mini, budget)"))
		Expect(rep.header.Get(server.UpstreamHeader)).To(Equal("small"))
		Expect(r.primary.Requests()).To(HaveLen(1))
		Expect(r.secondary.Requests()).To(BeEmpty(), "nothing was sent to the upstream whose budget refused it")
		Expect(r.llm.Requests()).To(HaveLen(1))
		Expect(string(r.llm.Requests()[0].Body)).To(ContainSubstring(`"model":"gpt-4o-mini"`))
		Expect(counter(r.m.RuleRequests.WithLabelValues("big-on-secondary", "minute", "refused"))).To(Equal(1.0))
		Expect(counter(r.m.Providers.Fallbacks.WithLabelValues("gpt-4o", "gpt-4o-mini"))).To(Equal(1.0))
		Expect(r.keyLevel()).To(Equal(100000.0-42), "the key is charged once, the usage of the fallback's answer")
	})
})
