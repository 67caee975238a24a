// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package server_test

import (
	"encoding/json"
	"net/http/httptest"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/tokenwarden/tokenwarden/proxy/server"
	"github.com/tokenwarden/tokenwarden/proxy/tokenize"
	"github.com/tokenwarden/tokenwarden/test/fakellm"
)

// groupDoc has models whose upstreams' provider models count in different encodings.
const groupDoc = `
upstreams:
- {name: a, url: UPSTREAM, provider: openai}
- {name: b, url: UPSTREAM}
models:
- {name: group, context_window: 1000, upstreams: [{upstream: a, tokenizer: o200k_base}, {upstream: b, tokenizer: cl100k_base}]}
- {name: mixed, context_window: 1000, tokenizer: o200k_base, upstreams: [{upstream: a}, {upstream: b, tokenizer: cl100k_base}]}
- {name: mono, context_window: 1000, upstreams: [{upstream: a, tokenizer: o200k_base}]}
api_keys:
- {name: alice, key_sha256: HASH(alice)}
rate_limiting:
  budget_division: {replicas: 1}
  limits:
    per_api_key: {tokens_per_minute: 100000}
`

// tokenizerGroups are the specs of models whose candidates count in different
// encodings. They run after "builds an encoding only when a configuration names it",
// in its container: they build cl100k_base.
func tokenizerGroups() {
	Describe("in a group", tokenizerGroupSpecs)
}

func tokenizerGroupSpecs() {
	// Hindi text: o200k_base counts about 4 tokens for each repetition, cl100k_base 14.
	hindi := func(n int) string { return strings.Repeat("नमस्ते दुनिया ", n) }
	largest := func(body string) int64 {
		o, _ := tokenize.Get(tokenize.O200kBase).Body([]byte(body))
		c, _ := tokenize.Get(tokenize.Cl100kBase).Body([]byte(body))
		return max(o.Input, c.Input)
	}
	textCount := func(enc, body string) int64 {
		r, _ := tokenize.Get(enc).Body([]byte(body))
		return r.Text
	}

	DescribeTable("counts with every candidate's encoding and keeps the largest",
		func(model string, reps int, wantCode int, counted string) {
			out := &logLines{}
			h := newObservedHarness(groupDoc, server.Options{AccessLog: out})
			body := chatOf(model, hindi(reps), 10)
			rep := h.do("POST", "/v1/chat/completions", "sk-alice", body)
			Expect(rep.code).To(Equal(wantCode), string(rep.body))
			if wantCode == 400 {
				Expect(rep.errorField("error", "message")).To(ContainSubstring("input of at least %d tokens", textCount(counted, body)))
				Expect(h.llm.Requests()).To(BeEmpty())
				return
			}
			want := int64(0)
			if counted == "largest" {
				want = largest(body)
			} else {
				r, _ := tokenize.Get(counted).Body([]byte(body))
				want = r.Input
			}
			Expect(out.logged(id(rep))).To(HaveKeyWithValue("tokens_reserved", float64(want+10)))
		},
		Entry("a group over the window by its larger count is refused, naming that count", "group", 100, 400, tokenize.Cl100kBase),
		Entry("the same prompt fits a model of the smaller encoding alone", "mono", 100, 200, tokenize.O200kBase),
		Entry("a group that fits reserves the larger count", "group", 40, 200, "largest"),
		Entry("an upstream's encoding beside the model's: the larger count too", "mixed", 40, 200, "largest"),
		Entry("an upstream's encoding beside the model's is pre-checked by the larger", "mixed", 100, 400, tokenize.Cl100kBase),
	)

	It("counts an unavailable model's substitute with the substitute's own encoding", func() {
		main, spare := fakellm.New(), fakellm.New()
		doc := `
upstreams:
- {name: main, url: MAIN}
- {name: spare, url: SPARE}
models:
- {name: wide, tokenizer: o200k_base, unavailable_fallback: narrow, upstreams: [{upstream: main}]}
- {name: narrow, context_window: 1000, tokenizer: cl100k_base, upstreams: [{upstream: spare}]}
api_keys:
- {name: alice, key_sha256: HASH(alice)}
rate_limiting:
  budget_division: {replicas: 1}
  limits:
    per_api_key: {tokens_per_minute: 100000}
`
		for name, b := range map[string]*fakellm.Server{"MAIN": main, "SPARE": spare} {
			srv := httptest.NewServer(b)
			DeferCleanup(srv.Close)
			doc = strings.ReplaceAll(doc, name, srv.URL)
		}
		h := newHarness(doc)
		main.Set(fakellm.Behaviour{Status: 429, Header: map[string]string{"Retry-After": "60"}})
		Expect(h.do("POST", "/v1/chat/completions", "sk-alice", chatOf("wide", "hi", 10)).code).To(Equal(429), "main cools")
		// About 400 tokens in o200k_base, 1,400 in cl100k_base: over narrow's window.
		body := chatOf("wide", hindi(100), 10)
		rep := h.do("POST", "/v1/chat/completions", "sk-alice", body)
		Expect(rep.code).To(Equal(503), string(rep.body))
		Expect(spare.Requests()).To(BeEmpty(), "the substitute's window, counted in its encoding, does not fit")
		rep = h.do("POST", "/v1/chat/completions", "sk-alice", chatOf("wide", hindi(20), 10))
		Expect(rep.code).To(Equal(200), string(rep.body))
		Expect(rep.header.Get(server.FallbackHeader)).To(Equal("fallback(wide -> narrow, pre-attempt, unavailable)"))
	})

	It("shows each upstream's encoding in /admin/effective", func() {
		h := newObservedHarness(groupDoc, server.Options{AccessLog: &logLines{}})
		e := effectiveOf(h)
		Expect(e.Models[1].Name).To(Equal("mixed"))
		Expect(e.Models[1].Upstreams[0].Tokenizer).To(Equal(tokenize.O200kBase), "the model's")
		Expect(e.Models[1].Upstreams[1].Tokenizer).To(Equal(tokenize.Cl100kBase), "its own")
	})
}

// effectiveOf is the proxy's /admin/effective.
func effectiveOf(h *harness) server.Effective {
	GinkgoHelper()
	admin := httptest.NewServer(h.srv.AdminHandler(h.reg))
	DeferCleanup(admin.Close)
	resp, err := admin.Client().Get(admin.URL + "/admin/effective")
	Expect(err).NotTo(HaveOccurred())
	defer resp.Body.Close()
	Expect(resp.StatusCode).To(Equal(200))
	var e server.Effective
	Expect(json.NewDecoder(resp.Body).Decode(&e)).To(Succeed())
	return e
}
