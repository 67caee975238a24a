// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package server_test

import (
	"bytes"
	"compress/gzip"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/test/fakellm"
)

// Hostile request bodies against a running proxy: each entry is the attack as a client
// would send it, and what it must leave in alice's minute bucket (10,000 tokens).
const attackDoc = keysDoc + `
  limits:
    per_api_key: {tokens_per_minute: 10000}
    per_model:
      gpt-4o: {tokens_per_minute: 5000}
`

var _ = Describe("Hostile request bodies", func() {
	var h *harness
	level := func() float64 { return h.level(budget.TokensMinute, budget.APIKey, "alice", 10000) }
	BeforeEach(func() {
		h = newHarness(attackDoc)
		h.llm.Set(fakellm.Behaviour{InputTokens: 10, OutputTokens: 10})
	})

	DescribeTable("are refused, counted as the upstream reads them, and take nothing they did not pay for",
		func(path, body string, status int, errType string) {
			r := h.do("POST", path, "sk-alice", body)
			Expect(r.code).To(Equal(status), "%s", r.body)
			if errType != "" {
				if strings.Contains(path, "messages") {
					Expect(r.errorField("type")).To(Equal("error"), "the Anthropic error shape")
					Expect(r.errorField("error", "type")).To(Equal(errType))
				} else {
					Expect(r.errorField("error", "type")).To(Equal(errType), "the OpenAI error shape")
				}
			}
			Expect(h.llm.Requests()).To(BeEmpty(), "nothing reached the backend")
			Expect(level()).To(BeNumerically("~", 10000, 0.01), "nothing was reserved, nothing leaked")
		},
		Entry("a few MiB of nested arrays is a 400, not a crash",
			"/v1/chat/completions", `{"messages":`+strings.Repeat("[", 4<<20), 400, "invalid_request_error"),
		Entry("the same on the Anthropic route answers in Anthropic's shape",
			"/v1/messages", `{"messages":`+strings.Repeat("[", 1001)+strings.Repeat("]", 1001)+`}`, 400, "invalid_request_error"),
		Entry(`"m\u0065ssages" is messages: its prompt counts`,
			"/v1/chat/completions", `{"model":"m","max_tokens":10,"m\u0065ssages":[{"role":"user","content":"`+strings.Repeat("a", 60000)+`"}]}`, 429, ""),
		Entry(`"max_\u0074okens" is max_tokens: its ceiling counts`,
			"/v1/chat/completions", `{"model":"m","max_\u0074okens":20000}`, 429, ""),
		Entry(`"mod\u0065l" is model: its per_model budget applies`,
			"/v1/chat/completions", `{"mod\u0065l":"gpt-4o","max_tokens":6000}`, 429, ""),
		Entry("a ceiling of 1e30 saturates instead of wrapping to a free negative amount",
			"/v1/chat/completions", `{"model":"m","max_tokens":1e30}`, 429, ""),
		Entry("a ceiling times n that overflows saturates",
			"/v1/chat/completions", `{"model":"m","max_tokens":4611686018427387904,"n":1e300}`, 429, ""),
		Entry("object keys count as text",
			"/v1/chat/completions", `{"model":"m","max_tokens":10,"messages":[{"`+strings.Repeat("k", 60000)+`":"user"}]}`, 429, ""),
		Entry("a data: URL sent as text costs its text, not a flat image",
			"/v1/chat/completions", `{"model":"m","max_tokens":10,"messages":[{"role":"user","content":"data:`+strings.Repeat("a", 60000)+`"}]}`, 429, ""),
		Entry("a string under data with nothing saying it is media costs its text",
			"/v1/chat/completions", `{"model":"m","max_tokens":10,"messages":[{"role":"user","content":[{"type":"text","text":"hi","data":"`+strings.Repeat("QUJD", 15000)+`"}]}]}`, 429, ""),
		Entry("a prompt array of three prompts reserves three ceilings",
			"/v1/completions", `{"model":"m","max_tokens":4000,"prompt":["a","b","c"]}`, 429, ""),
		Entry("best_of multiplies the ceiling",
			"/v1/completions", `{"model":"m","max_tokens":4000,"prompt":"a","best_of":3}`, 429, ""),
	)

	gz := func(s string) string {
		var b bytes.Buffer
		zw := gzip.NewWriter(&b)
		_, _ = zw.Write([]byte(s))
		_ = zw.Close()
		return b.String()
	}
	DescribeTable("a compressed request body is estimated on what it decodes to",
		func(encoding, body string, status int) {
			r := h.do("POST", "/v1/chat/completions", "sk-alice", body, "Content-Encoding", encoding)
			Expect(r.code).To(Equal(status), "%s", r.body)
			Expect(h.llm.Requests()).To(BeEmpty(), "nothing reached the backend")
			Expect(level()).To(BeNumerically("~", 10000, 0.01), "nothing was reserved")
		},
		Entry("a gzip body whose prompt is over the budget is refused, not charged its compressed size",
			"gzip", gz(`{"model":"m","max_tokens":10,"messages":[{"role":"user","content":"`+strings.Repeat("a", 200000)+`"}]}`), 429),
		Entry("a gzip body that decodes past max_body_bytes is a 413",
			"gzip", gz(`{"model":"m","messages":[{"role":"user","content":"`+strings.Repeat("a", 17<<20)+`"}]}`), 413),
		Entry("a body in a coding the proxy cannot read is a 415", "br", `{"model":"m","max_tokens":10}`, 415),
		Entry("a body labelled gzip that is not gzip is a 400", "gzip", `{"model":"m","max_tokens":10}`, 400),
	)

	It("forwards a compressed body it admitted as the client sent it", func() {
		body := gz(`{"model":"m","max_tokens":10,"messages":[{"role":"user","content":"hi"}]}`)
		r := h.do("POST", "/v1/chat/completions", "sk-alice", body, "Content-Encoding", "gzip")
		Expect(r.code).To(Equal(200))
		reqs := h.llm.Requests()
		Expect(reqs).To(HaveLen(1))
		Expect(string(reqs[0].Body)).To(Equal(body))
		Expect(reqs[0].Header.Get("Content-Encoding")).To(Equal("gzip"))
	})

	It(`reads duplicated keys as the upstream does: the last "max_tokens" and "n" win, on a drained budget`, func() {
		h.llm.Set(fakellm.Behaviour{InputTokens: 9000, OutputTokens: 0})
		Expect(h.chat("sk-alice", 10).code).To(Equal(200))
		Eventually(level).Should(BeNumerically("~", 1000, 0.01))
		h.llm.Reset()
		r := h.do("POST", "/v1/chat/completions", "sk-alice", `{"model":"m","max_tokens":1e30,"max_tokens":4000,"n":5,"n":1}`)
		Expect(r.code).To(Equal(429), "4,000 tokens do not fit the 1,000 left")
		Expect(h.llm.Requests()).To(BeEmpty())
		Expect(level()).To(BeNumerically("~", 1000, 0.01))
	})
})
