// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package server_test

import (
	"encoding/json"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/proxy/server"
)

// policyDoc serves gpt-4o, which accepts a lowered cap, and plain, which does not;
// both have a window of 1,000 tokens and generate at most 600. POLICY is the fleet's
// admission policy, MODELPOLICY gpt-4o's own.
const policyDoc = `
upstreams:
- {name: default, url: UPSTREAM}
models:
- {name: gpt-4o, context_window: 1000, max_output_tokens: 600, accepts_lowered_output_cap: true, MODELPOLICY upstreams: [{upstream: default}]}
- {name: plain, context_window: 1000, max_output_tokens: 600, upstreams: [{upstream: default}]}
routing: {admission_policy: POLICY}
api_keys:
- {name: alice, key_sha256: HASH(alice)}
rate_limiting:
  budget_division: {replicas: 1}
  limits:
    per_api_key: {tokens_per_minute: 100000}
`

// routeFamily is a route family: its path and the output cap field its body states.
type routeFamily struct{ path, field string }

var (
	chatFamily        = routeFamily{"/v1/chat/completions", "max_tokens"}
	completionsFamily = routeFamily{"/v1/completions", "max_tokens"}
	responsesFamily   = routeFamily{"/v1/responses", "max_output_tokens"}
	messagesFamily    = routeFamily{"/v1/messages", "max_tokens"}
)

// body is a request of the family to model with a prompt of words words, asking for
// out output tokens (none when out is 0).
func (f routeFamily) body(model string, words, out int) string {
	prompt := strings.Repeat("word ", words)
	cap := ""
	if out > 0 {
		cap = `,"` + f.field + `":` + itoa(out)
	}
	switch f.path {
	case "/v1/completions":
		return `{"model":"` + model + `","prompt":"` + prompt + `"` + cap + `}`
	case "/v1/responses":
		return `{"model":"` + model + `","input":"` + prompt + `"` + cap + `}`
	}
	return `{"model":"` + model + `","messages":[{"role":"user","content":"` + prompt + `"}]` + cap + `}`
}

// forwardedCap is the output cap field of the body the backend received.
func forwardedCap(body []byte, field string) float64 {
	GinkgoHelper()
	var m map[string]any
	Expect(json.Unmarshal(body, &m)).To(Succeed())
	v, _ := m[field].(float64)
	return v
}

var _ = Describe("The admission policy", func() {
	newPolicy := func(fleet, model string, out *logLines) *harness {
		mp := ""
		if model != "" {
			mp = "admission_policy: " + model + ","
		}
		doc := strings.NewReplacer("MODELPOLICY", mp, "POLICY", fleet).Replace(policyDoc)
		return newObservedHarness(doc, server.Options{AccessLog: out})
	}

	// A prompt of 700 words is at least 700 tokens, 701 in a message: the window
	// leaves 300, or 299.
	DescribeTable("decides an over-ask on every route family",
		func(fleet, modelPolicy, model string, f routeFamily, words, ask, wantCode int, wantClamp string, wantForwarded int) {
			out := &logLines{}
			h := newPolicy(fleet, modelPolicy, out)
			rep := h.do("POST", f.path, "sk-alice", f.body(model, words, ask))
			Expect(rep.code).To(Equal(wantCode), string(rep.body))
			Expect(rep.header.Get(server.ClampHeader)).To(Equal(wantClamp))
			if wantCode != 200 {
				Expect(h.llm.Requests()).To(BeEmpty(), "refused before any upstream")
				Expect(h.level(budget.TokensMinute, budget.APIKey, "alice", 100000)).To(Equal(100000.0), "nothing was reserved")
				return
			}
			Expect(h.llm.Requests()).To(HaveLen(1))
			Expect(forwardedCap(h.llm.Requests()[0].Body, f.field)).To(Equal(float64(wantForwarded)))
			l := out.logged(id(rep))
			Expect(l).To(HaveKeyWithValue("output_admitted", float64(wantForwarded)))

			// The reservation is the one a request asking for the lowered cap takes:
			// the context-admitted output is one part of it, not all of it.
			again := h.do("POST", f.path, "sk-alice", f.body(model, words, wantForwarded))
			Expect(again.code).To(Equal(200))
			Expect(again.header.Get(server.ClampHeader)).To(BeEmpty())
			Expect(l["tokens_reserved"]).To(Equal(out.logged(id(again))["tokens_reserved"]))
			Expect(l["tokens_reserved"]).To(BeNumerically(">", wantForwarded))
		},
		Entry("refuse: chat over the window is refused", "refuse", "", "gpt-4o", chatFamily, 700, 500, 400, "", 0),
		Entry("refuse: completions over the window is refused", "refuse", "", "gpt-4o", completionsFamily, 700, 500, 400, "", 0),
		Entry("refuse: responses over the window is refused", "refuse", "", "gpt-4o", responsesFamily, 700, 500, 400, "", 0),
		Entry("refuse: messages over the window is refused", "refuse", "", "gpt-4o", messagesFamily, 700, 500, 400, "", 0),

		Entry("clamp: chat over the window is lowered to what the window leaves", "clamp", "", "gpt-4o", chatFamily, 700, 500, 200, "500 -> 299 (context_window)", 299),
		Entry("clamp: completions over the window is lowered", "clamp", "", "gpt-4o", completionsFamily, 700, 500, 200, "500 -> 300 (context_window)", 300),
		Entry("clamp: responses over the window is lowered", "clamp", "", "gpt-4o", responsesFamily, 700, 500, 200, "500 -> 300 (context_window)", 300),
		Entry("clamp: messages over the window is lowered", "clamp", "", "gpt-4o", messagesFamily, 700, 500, 200, "500 -> 299 (context_window)", 299),
		Entry("clamp: more than the model generates is lowered to its largest output", "clamp", "", "gpt-4o", chatFamily, 10, 900, 200, "900 -> 600 (max_output_tokens)", 600),
		Entry("clamp: a model's own policy overrides the fleet's", "refuse", "clamp", "gpt-4o", messagesFamily, 700, 500, 200, "500 -> 299 (context_window)", 299),
		Entry("clamp: a model's own refuse overrides the fleet's clamp", "clamp", "refuse", "gpt-4o", chatFamily, 700, 500, 400, "", 0),

		Entry("clamp without the model's declaration refuses (chat)", "clamp", "", "plain", chatFamily, 700, 500, 400, "", 0),
		Entry("clamp without the model's declaration refuses (messages)", "clamp", "", "plain", messagesFamily, 700, 500, 400, "", 0),

		Entry("clamp: a prompt that does not fit is refused (chat)", "clamp", "", "gpt-4o", chatFamily, 1200, 100, 400, "", 0),
		Entry("clamp: a prompt that does not fit is refused (responses)", "clamp", "", "gpt-4o", responsesFamily, 1200, 100, 400, "", 0),
		Entry("clamp: a prompt that does not fit is refused without a cap (completions)", "clamp", "", "gpt-4o", completionsFamily, 1200, 0, 400, "", 0),
		Entry("refuse: a prompt that does not fit is refused (messages)", "refuse", "", "gpt-4o", messagesFamily, 1200, 100, 400, "", 0),

		Entry("clamp: what fits is forwarded as asked", "clamp", "", "gpt-4o", completionsFamily, 700, 299, 200, "", 299),
	)

	It("logs what the window leaves a request that states no cap, apart from its reservation", func() {
		out := &logLines{}
		h := newPolicy("clamp", "", out)
		rep := h.do("POST", chatFamily.path, "sk-alice", chatFamily.body("gpt-4o", 700, 0))
		Expect(rep.code).To(Equal(200))
		Expect(rep.header.Get(server.ClampHeader)).To(BeEmpty(), "a capless request is checked for input fit only")
		Expect(forwardedCap(h.llm.Requests()[0].Body, "max_tokens")).To(BeZero(), "nothing is inserted")
		l := out.logged(id(rep))
		Expect(l).To(HaveKeyWithValue("output_admitted", 299.0))
		Expect(l["tokens_reserved"]).To(BeNumerically(">", 4096), "the reservation is the default output's")
		Expect(counter(h.m.Providers.ContextClamps.WithLabelValues("gpt-4o", "context_window"))).To(BeZero())
	})

	It("counts each clamp by model and limit", func() {
		h := newPolicy("clamp", "", &logLines{})
		Expect(h.do("POST", chatFamily.path, "sk-alice", chatFamily.body("gpt-4o", 700, 500)).code).To(Equal(200))
		Expect(counter(h.m.Providers.ContextClamps.WithLabelValues("gpt-4o", "context_window"))).To(Equal(1.0))
	})
	DescribeTable("shows the policy in force per model and the fleet's default in /admin/effective",
		func(fleet, model, wantDefault, wantFrom, wantGPT, wantGPTFrom, wantPlain, wantPlainFrom string) {
			h := newPolicy(fleet, model, &logLines{})
			e, ok := h.srv.Effective()
			Expect(ok).To(BeTrue())
			Expect(e.Routing.AdmissionPolicy).To(Equal(server.EffectiveValue{Value: wantDefault, From: wantFrom}))
			Expect(e.Models[0].AdmissionPolicy).To(Equal(server.EffectiveValue{Value: wantGPT, From: wantGPTFrom}))
			Expect(e.Models[1].AdmissionPolicy).To(Equal(server.EffectiveValue{Value: wantPlain, From: wantPlainFrom}))
		},
		Entry("the fleet's clamp: only the model that accepts a lowered cap clamps", "clamp", "", "clamp", "routing.admission_policy",
			"clamp", "routing.admission_policy",
			"refuse", "routing.admission_policy is clamp, but models[1].accepts_lowered_output_cap is not set: an over-ask is refused"),
		Entry("a model's own refuse over the fleet's clamp", "clamp", "refuse", "clamp", "routing.admission_policy",
			"refuse", "models[0].admission_policy",
			"refuse", "routing.admission_policy is clamp, but models[1].accepts_lowered_output_cap is not set: an over-ask is refused"),
		Entry("a model's own clamp under the fleet's refuse", "refuse", "clamp", "refuse", "routing.admission_policy",
			"clamp", "models[0].admission_policy", "refuse", "routing.admission_policy"),
	)
})
