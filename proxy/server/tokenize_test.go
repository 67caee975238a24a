// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package server_test

import (
	"encoding/json"
	"net/http/httptest"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/proxy/estimate"
	"github.com/tokenwarden/tokenwarden/proxy/server"
	"github.com/tokenwarden/tokenwarden/proxy/tokenize"
	"github.com/tokenwarden/tokenwarden/test/fakellm"
)

// tokenizerModel is gpt-4.1: the window and cap of gpt-4o, its input counted with
// o200k_base.
const tokenizerModel = `- name: gpt-4.1
  context_window: 1000
  max_output_tokens: 300
  tokenizer: o200k_base
  upstreams: [{upstream: primary}]
`

// newTokenizerRegistry is newRegistry with gpt-4.1 counted by the encoding named.
func newTokenizerRegistry(encoding string) *registry {
	GinkgoHelper()
	r := newRegistry("")
	r.doc = strings.Replace(r.doc, "api_keys:", strings.Replace(tokenizerModel, "o200k_base", encoding, 1)+"api_keys:", 1)
	Expect(r.apply(r.doc)).To(Succeed())
	return r
}

// chatOf is a chat request of model with one user message.
func chatOf(model, content string, maxTokens int) string {
	b, _ := json.Marshal(map[string]any{"model": model, "max_tokens": maxTokens,
		"messages": []map[string]string{{"role": "user", "content": content}}})
	return string(b)
}

// Ordered: the last specs build cl100k_base, which one before them finds unbuilt.
var _ = Describe("A model with a tokenizer", Ordered, func() {
	It("pre-checks the tokenizer's count: it refuses what the lower bound under-counts", func() {
		r := newTokenizerRegistry(tokenize.O200kBase)
		// 12,000 spaces: 95 tokens of o200k_base, and a lower bound of 2 (spaces count
		// nothing in it): both admit it.
		spaces := strings.Repeat(" ", 12000) + "hi"
		Expect(r.do("POST", "/v1/chat/completions", "sk-alice", chatOf("gpt-4o", spaces, 10)).code).To(Equal(200), "the estimate's lower bound admits it")
		rep := r.do("POST", "/v1/chat/completions", "sk-alice", chatOf("gpt-4.1", spaces, 10))
		Expect(rep.code).To(Equal(200), string(rep.body))

		// "1 " 600 times: a lower bound of 201 tokens (digits in threes, and "user"),
		// 1,200 tokens of o200k_base (and 8 more for the model name, the user role and
		// max_tokens).
		digits := strings.Repeat("1 ", 600)
		Expect(r.do("POST", "/v1/chat/completions", "sk-alice", chatOf("gpt-4o", digits, 10)).code).To(Equal(200), "the lower bound lets it through")
		before := len(r.primary.Requests())
		rep = r.do("POST", "/v1/chat/completions", "sk-alice", chatOf("gpt-4.1", digits, 10))
		Expect(rep.code).To(Equal(400))
		Expect(rep.errorField("error", "code")).To(Equal("context_length_exceeded"))
		Expect(rep.errorField("error", "message")).To(ContainSubstring(`input of at least 1208 tokens plus the 10 output tokens it asks for is 1218, over the context window of 1000 tokens of model "gpt-4.1"`))
		Expect(r.primary.Requests()).To(HaveLen(before), "refused before any upstream call")
		Expect(counter(r.m.Providers.ContextRefusals.WithLabelValues("gpt-4.1", "context_window"))).To(Equal(1.0))
	})

	It("reserves the tokenizer's count, with the estimate's allowance per message", func() {
		r := newTokenizerRegistry(tokenize.O200kBase)
		// No usage reported: each answer settles on its input estimate plus its text,
		// which shows the input the reservation used.
		r.primary.Set(fakellm.Behaviour{OutputTokens: 3, OmitUsage: true})
		prose := strings.Repeat("The quick brown fox jumps over the lazy dog. ", 30)
		spent := func(model string) float64 {
			GinkgoHelper()
			before := r.keyLevel()
			Expect(r.do("POST", "/v1/chat/completions", "sk-alice", chatOf(model, prose, 10)).code).To(Equal(200))
			return before - r.keyLevel()
		}
		byEstimate, byTokenizer := spent("gpt-4o"), spent("gpt-4.1")
		est, err := estimate.Body([]byte(chatOf("gpt-4o", prose, 10)))
		Expect(err).NotTo(HaveOccurred())
		tok, ok := tokenize.Get(tokenize.O200kBase).Body([]byte(chatOf("gpt-4.1", prose, 10)))
		Expect(ok).To(BeTrue())
		count := tokenize.Get(tokenize.O200kBase).Count
		Expect(tok.Input).To(Equal(count(prose)+1+count("user")+count("gpt-4.1")+estimate.MessageFloor),
			"the prose, 10, user, gpt-4.1, and the message's floor")
		Expect(byTokenizer-float64(tok.Input)).To(Equal(byEstimate-float64(est.Input)), "the same answer text on both")
		Expect(byTokenizer).To(BeNumerically("<", byEstimate))
	})

	It("keeps the tokenizer's count when the agent limits clamp the request's output", func() {
		doc := `
upstreams:
- {name: default, url: UPSTREAM}
api_keys:
- {name: alice, key_sha256: HASH(alice)}
scheduling:
  classes:
    interactive: {max_output_tokens: 50}
models:
- {name: gpt-4o, tokenizer: o200k_base}
rate_limiting:
  budget_division: {replicas: 1}
  limits:
    per_api_key: {tokens_per_minute: 100000}
`
		h := newHarness(doc)
		h.llm.Set(fakellm.Behaviour{OutputTokens: 3, OmitUsage: true})
		prose := strings.Repeat("The quick brown fox jumps over the lazy dog. ", 30)
		spent := func(model string) (float64, []byte) {
			GinkgoHelper()
			before := h.level(budget.TokensMinute, budget.APIKey, "alice", 100000)
			Expect(h.do("POST", "/v1/chat/completions", "sk-alice", chatOf(model, prose, 1000)).code).To(Equal(200))
			reqs := h.llm.Requests()
			return before - h.level(budget.TokensMinute, budget.APIKey, "alice", 100000), reqs[len(reqs)-1].Body
		}
		byTokenizer, sentTok := spent("gpt-4o")
		byEstimate, sentEst := spent("llama")
		Expect(string(sentTok)).To(ContainSubstring(`"max_tokens":50`), "the class's cap")
		tok, _ := tokenize.Get(tokenize.O200kBase).Body(sentTok)
		est, _ := estimate.Body(sentEst)
		Expect(byTokenizer-float64(tok.Input)).To(Equal(byEstimate-float64(est.Input)), "the same answer text on both")
		Expect(byTokenizer).To(BeNumerically("<", byEstimate))
	})

	It("builds an encoding only when a configuration names it, and shows it in /admin/effective", func() {
		Expect(tokenize.Loaded(tokenize.Cl100kBase)).To(BeFalse(), "no configuration named cl100k_base yet")
		r := newTokenizerRegistry(tokenize.Cl100kBase)
		Expect(tokenize.Loaded(tokenize.Cl100kBase)).To(BeTrue())
		admin := httptest.NewServer(r.srv.AdminHandler(r.reg))
		DeferCleanup(admin.Close)
		resp, err := admin.Client().Get(admin.URL + "/admin/effective")
		Expect(err).NotTo(HaveOccurred())
		defer resp.Body.Close()
		Expect(resp.StatusCode).To(Equal(200))
		var e server.Effective
		Expect(json.NewDecoder(resp.Body).Decode(&e)).To(Succeed())
		Expect(e.Models[0].Tokenizer).To(BeNil(), "gpt-4o is estimated")
		Expect(e.Models[2].Name).To(Equal("gpt-4.1"))
		Expect(e.Models[2].Tokenizer).To(Equal(&server.EffectiveValue{Value: "cl100k_base", From: "models[2].tokenizer"}))
	})

	tokenizerGroups()
})
