// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package server_test

import (
	"net/http/httptest"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/tokenwarden/tokenwarden/proxy/server"
	"github.com/tokenwarden/tokenwarden/test/fakellm"
)

// substituteDoc: gpt-4o (on main) falls back to gpt-4o-mini (on spare) when main is
// unavailable, and gpt-4o-mini to gpt-3 (on third); plain shares main and has no
// fallback. Each model's budget is a rule of its own.
const substituteDoc = `
upstreams:
- {name: main, url: MAIN}
- {name: spare, url: SPARE}
- {name: third, url: THIRD}
models:
- {name: gpt-4o, unavailable_fallback: gpt-4o-mini, upstreams: [{upstream: main}]}
- {name: gpt-4o-mini, context_window: 1000, unavailable_fallback: gpt-3, upstreams: [{upstream: spare, provider_model: gpt-4o-mini-2024-07-18}]}
- {name: gpt-3, upstreams: [{upstream: third}]}
- {name: plain, upstreams: [{upstream: main}]}
api_keys:
- {name: alice, key_sha256: HASH(alice)}
rate_limiting:
  budget_division: {replicas: 1}
  rules:
  - {name: big, dimension: model, subjects: [gpt-4o], windows: [{limit: 100000, rolling: {period: minute}}]}
  - {name: small, dimension: model, subjects: [gpt-4o-mini], windows: [{limit: SMALL, rolling: {period: minute}}], fallback_model: gpt-3}
`

// substitution is a proxy on substituteDoc with its three backends.
type substitution struct {
	*harness
	main, spare, third *fakellm.Server
}

func newSubstitution(small string) *substitution {
	s := &substitution{main: fakellm.New(), spare: fakellm.New(), third: fakellm.New()}
	pairs := []string{"SMALL", small}
	for name, b := range map[string]*fakellm.Server{"MAIN": s.main, "SPARE": s.spare, "THIRD": s.third} {
		srv := httptest.NewServer(b)
		DeferCleanup(srv.Close)
		pairs = append(pairs, name, srv.URL)
	}
	s.harness = newHarness(strings.NewReplacer(pairs...).Replace(substituteDoc))
	return s
}

// coolMain makes main answer 429 asking for a minute's wait: its credential cools.
func (s *substitution) coolMain() {
	GinkgoHelper()
	s.main.Set(fakellm.Behaviour{Status: 429, Header: map[string]string{"Retry-After": "60"}})
	Expect(s.chat("sk-alice", 10).code).To(Equal(429), "main's own 429, with no other upstream")
	s.main.Set(fakellm.Behaviour{})
	s.main.Reset()
}

// ruleNet is what a rule's budget holds after settlement.
func (s *substitution) ruleNet(rule string) float64 {
	return counter(s.m.RuleAmount.WithLabelValues(rule, "minute", "reserved")) - counter(s.m.RuleAmount.WithLabelValues(rule, "minute", "refunded"))
}

var _ = Describe("Availability fallback", func() {
	It("serves a model whose every upstream is unavailable with its substitute, charged to the substitute, and says so", func() {
		s := newSubstitution("100000")
		s.coolMain()
		big := s.ruleNet("big")
		s.spare.Set(fakellmUsage(30, 12))
		rep := s.chat("sk-alice", 200)
		Expect(rep.code).To(Equal(200), string(rep.body))
		Expect(rep.header.Get(server.FallbackHeader)).To(Equal("fallback(gpt-4o -> gpt-4o-mini, pre-attempt, unavailable)"))
		Expect(rep.header.Get(server.UpstreamHeader)).To(Equal("spare"))
		Expect(s.main.Requests()).To(BeEmpty(), "no attempt on the cooling upstream")
		Expect(s.spare.Requests()).To(HaveLen(1))
		Expect(string(s.spare.Requests()[0].Body)).To(ContainSubstring(`"model":"gpt-4o-mini-2024-07-18"`))
		Expect(s.ruleNet("small")).To(Equal(42.0), "the substitute's budget is charged the usage")
		Expect(s.ruleNet("big")).To(Equal(big), "the model asked for is not charged")
		Expect(counter(s.m.Providers.Substitutions.WithLabelValues("gpt-4o", "gpt-4o-mini"))).To(Equal(1.0))
	})

	DescribeTable("answers 503 when the substitute cannot serve either",
		func(small string, prepare func(*substitution), body string, wantCode int) {
			s := newSubstitution(small)
			s.coolMain()
			prepare(s)
			rep := s.do("POST", "/v1/chat/completions", "sk-alice", body)
			Expect(rep.code).To(Equal(wantCode), string(rep.body))
			Expect(rep.header.Get(server.FallbackHeader)).To(BeEmpty(), "no model served the request in its place")
			Expect(s.third.Requests()).To(BeEmpty(), "a request moves once: the substitute's own fallbacks are not followed")
		},
		Entry("its context window does not fit the request", "100000", func(*substitution) {},
			`{"model":"gpt-4o","max_tokens":10,"messages":[{"role":"user","content":"`+strings.Repeat("word ", 1200)+`"}]}`, 503),
		Entry("its upstreams are unavailable too (its own substitute is not tried)", "100000", func(s *substitution) {
			s.spare.Set(fakellm.Behaviour{Status: 429, Header: map[string]string{"Retry-After": "60"}})
			Expect(s.do("POST", "/v1/chat/completions", "sk-alice", `{"model":"gpt-4o-mini","max_tokens":10,"messages":[]}`).code).To(Equal(429))
		}, `{"model":"gpt-4o","max_tokens":10,"messages":[]}`, 503),
		Entry("its budget refuses (and its budget's fallback is not followed)", "5", func(*substitution) {},
			`{"model":"gpt-4o","max_tokens":10,"messages":[]}`, 429),
	)

	It("is opt-in per model, and never replaces an available upstream", func() {
		s := newSubstitution("100000")
		s.coolMain()
		rep := s.do("POST", "/v1/chat/completions", "sk-alice", `{"model":"plain","max_tokens":10,"messages":[]}`)
		Expect(rep.code).To(Equal(503), "plain names no unavailable_fallback")
		Expect(rep.header.Get(server.FallbackHeader)).To(BeEmpty())

		s.clock.Advance(61e9)
		rep = s.chat("sk-alice", 10)
		Expect(rep.code).To(Equal(200))
		Expect(rep.header.Get(server.FallbackHeader)).To(BeEmpty())
		Expect(rep.header.Get(server.UpstreamHeader)).To(Equal("main"), "main cooled down and serves again")
	})
})
