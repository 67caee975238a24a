// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package server_test

import (
	"io"
	"net/http/httptest"
	"strings"
	"sync"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/proxy/server"
	"github.com/tokenwarden/tokenwarden/proxy/settlement"
	"github.com/tokenwarden/tokenwarden/proxy/usage"
	"github.com/tokenwarden/tokenwarden/test/fakellm"
)

// observed keeps a copy of each settlement it is told of.
type observed struct {
	mu  sync.Mutex
	got []settlement.Request
}

func (o *observed) Settled(r *settlement.Request) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.got = append(o.got, *r)
}

func (o *observed) all() []settlement.Request {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]settlement.Request(nil), o.got...)
}

// pricedDoc prices gpt-4o at $2.50 per million input tokens and $10 per million
// output tokens, and lets alice's key reserve 1,000 tokens a minute.
const pricedDoc = `
upstreams: [{name: default, url: UPSTREAM}]
models:
- {name: gpt-4o, price: {input: 2.5, output: 10}}
api_keys:
- {name: alice, key_sha256: HASH(alice), user: alice, team: research}
rate_limiting:
  budget_division: {replicas: 1}
  limits:
    per_api_key: {tokens_per_minute: 1000}
`

var _ = Describe("The observers of settlements", func() {
	var obs *observed
	BeforeEach(func() { obs = &observed{} })

	It("are told of a settled request: who sent it, what served it, what it used and cost, and when", func() {
		h := newObservedHarness(pricedDoc, server.Options{Observers: []settlement.Observer{obs}})
		h.llm.Set(fakellmUsage(100, 100))
		r := h.chat("sk-alice", 50)
		Expect(r.code).To(Equal(200))
		Eventually(obs.all).Should(HaveLen(1))
		got := obs.all()[0]
		Expect(got.RequestID).To(Equal(id(r)))
		Expect(got.Route).To(Equal("/v1/chat/completions"))
		Expect([]string{got.APIKey, got.User, got.Team, got.Model, got.Upstream}).To(Equal([]string{"alice", "alice", "research", "gpt-4o", "default"}))
		Expect(got.Attempts).To(Equal(1))
		Expect(got.Outcome).To(Equal(settlement.Usage))
		Expect(got.End).To(Equal(usage.Complete))
		Expect(got.Used).To(Equal(budget.Used{Input: 100, Output: 100}))
		// 100 × $2.50 + 100 × $10 per million tokens.
		Expect(got.Priced).To(BeTrue())
		Expect(got.CostMicros).To(Equal(int64(1250)))
		Expect(got.Start).To(Equal(h.clock.Now()), "on the proxy's clock")
		Expect(got.HandedOff).To(Equal(got.Start))
		Expect(got.Settled).To(Equal(got.Start))
	})

	It("are told of a stream cut short, settled on what it counted", func() {
		h := newObservedHarness(pricedDoc, server.Options{Observers: []settlement.Observer{obs}})
		h.llm.Set(fakellm.Behaviour{InputTokens: 10, OutputTokens: 40, CutAfter: 5})
		resp := h.post("/v1/chat/completions", "sk-alice", `{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}],"max_tokens":50,"stream":true}`)
		_, _ = io.Copy(io.Discard, resp.Body) // the stream ends early
		_ = resp.Body.Close()
		Eventually(obs.all).Should(HaveLen(1))
		got := obs.all()[0]
		Expect(got.Outcome).To(Equal(settlement.Usage))
		Expect(got.End).To(Equal(usage.Cut))
		Expect(got.Used.Output).To(BeNumerically(">", 0), "the output counted in the stream")
	})

	It("are told of a request the upstream failed, released", func() {
		h := newObservedHarness(pricedDoc, server.Options{Observers: []settlement.Observer{obs}})
		h.llm.Set(fakellm.Behaviour{Status: 500})
		Expect(h.chat("sk-alice", 50).code).To(Equal(500))
		Eventually(obs.all).Should(HaveLen(1))
		got := obs.all()[0]
		Expect(got.Outcome).To(Equal(settlement.Released))
		Expect(got.Used).To(Equal(budget.Used{}))
		Expect(got.CostMicros).To(BeZero())
	})

	It("name the upstream that served a request after a failover, and how many were tried", func() {
		primary := fakellm.New()
		primary.Set(fakellm.Behaviour{Status: 503})
		p := httptest.NewServer(primary)
		DeferCleanup(p.Close)
		doc := strings.ReplaceAll(`
upstreams:
- {name: primary, url: PRIMARY}
- {name: secondary, url: UPSTREAM}
models:
- name: gpt-4o
  upstreams: [{upstream: primary}, {upstream: secondary}]
api_keys:
- {name: alice, key_sha256: HASH(alice)}
rate_limiting:
  budget_division: {replicas: 1}
`, "PRIMARY", p.URL)
		h := newObservedHarness(doc, server.Options{Observers: []settlement.Observer{obs}})
		h.llm.Set(fakellmUsage(10, 20))
		Expect(h.chat("sk-alice", 50).code).To(Equal(200))
		Eventually(obs.all).Should(HaveLen(1))
		got := obs.all()[0]
		Expect(got.Upstream).To(Equal("secondary"))
		Expect(got.Attempts).To(Equal(2))
		Expect(got.Priced).To(BeFalse(), "the model has no price")
	})

	It("are not told of a refused request, nor of a route that is not charged", func() {
		h := newObservedHarness(pricedDoc, server.Options{Observers: []settlement.Observer{obs}})
		Expect(h.chat("sk-alice", 5000).code).To(Equal(429))
		Expect(h.do("GET", "/v1/models", "sk-alice", "").code).To(Equal(200))
		Consistently(obs.all, "50ms").Should(BeEmpty())
	})

	It("are told after the proxy's own, in the order given", func() {
		var order []string
		first := settlement.Func(func(*settlement.Request) { order = append(order, "first") })
		second := settlement.Func(func(*settlement.Request) { order = append(order, "second") })
		h := newObservedHarness(pricedDoc, server.Options{Observers: []settlement.Observer{first, second, obs}})
		h.llm.Set(fakellmUsage(100, 100))
		Expect(h.chat("sk-alice", 50).code).To(Equal(200))
		Eventually(obs.all).Should(HaveLen(1))
		Expect(order).To(Equal([]string{"first", "second"}))
		Expect(counter(h.m.Spend.WithLabelValues("gpt-4o"))).To(BeNumerically("~", 0.00125, 1e-12), "the spend metric is the proxy's own observer")
	})
})
