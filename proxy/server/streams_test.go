// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package server_test

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/test/fakellm"
)

const streamDoc = keysDoc + `
  limits:
    per_api_key: {tokens_per_minute: 60000}
`

func minuteLevel(h *harness) func() float64 {
	return func() float64 { return h.level(budget.TokensMinute, budget.APIKey, "alice", 60000) }
}

var _ = Describe("Streams", func() {
	DescribeTable("settle at their normal end on the usage the stream reports",
		func(path, body string, extra ...string) {
			h := newHarness(streamDoc)
			h.llm.Set(fakellm.Behaviour{InputTokens: 100, OutputTokens: 7})
			r := h.do("POST", path, "sk-alice", body, extra...)
			Expect(r.code).To(Equal(200))
			Expect(r.header.Get("Content-Type")).To(HavePrefix("text/event-stream"))
			Expect(strings.Count(string(r.body), `"word "`)).To(Equal(7), "every delta reaches the client")
			Eventually(minuteLevel(h)).Should(BeNumerically("~", 60000-107, 0.01))
			Expect(counter(h.m.Settlements.WithLabelValues("settled"))).To(Equal(1.0))
		},
		Entry("OpenAI chat with include_usage", "/v1/chat/completions",
			`{"model":"m","stream":true,"stream_options":{"include_usage":true},"max_tokens":500,"messages":[{"role":"user","content":"hi"}]}`),
		Entry("OpenAI completions", "/v1/completions", `{"model":"m","stream":true,"max_tokens":500,"prompt":"say hi"}`),
		Entry("the Responses API (response.completed)", "/v1/responses", `{"model":"m","stream":true,"max_output_tokens":500,"input":"say hi"}`),
		Entry("Anthropic messages (message_start plus message_delta)", "/v1/messages",
			`{"model":"c","stream":true,"max_tokens":500,"messages":[{"role":"user","content":"hi"}]}`),
	)

	It("settles a stream without usage on the input estimate plus the counted deltas", func() {
		h := newHarness(streamDoc)
		h.llm.Set(fakellm.Behaviour{OutputTokens: 20, OmitUsage: true})
		r := h.chat("sk-alice", 500, `,"stream":true`)
		Expect(r.code).To(Equal(200))
		// The input estimate (the "stream" key adds 2); 20 deltas of "word " are 2 tokens each.
		Eventually(minuteLevel(h)).Should(BeNumerically("~", 60000-(chatInput+2)-40, 0.01))
	})

	It("settles a stream the backend cuts after some deltas on the input estimate plus the counted deltas", func() {
		h := newHarness(streamDoc)
		h.llm.Set(fakellm.Behaviour{InputTokens: 100, OutputTokens: 50, CutAfter: 3})
		resp := h.post("/v1/chat/completions", "sk-alice", `{"model":"m","stream":true,"max_tokens":500,"messages":[{"role":"user","content":"hi"}]}`)
		_, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
		// 20 input tokens estimated (keys, strings, the ceiling, the floor); 3 deltas of
		// "word " are 2 tokens each.
		Eventually(minuteLevel(h)).Should(BeNumerically("~", 60000-20-6, 0.01))
		Expect(counter(h.m.Settlements.WithLabelValues("settled"))).To(Equal(1.0))
	})

	It("releases a stream the backend cuts before its first delta", func() {
		h := newHarness(streamDoc)
		h.llm.Set(fakellm.Behaviour{InputTokens: 100, OutputTokens: 50, CutAtStart: true})
		req, _ := http.NewRequest("POST", h.front.URL+"/v1/chat/completions",
			strings.NewReader(`{"model":"m","stream":true,"max_tokens":500,"messages":[{"role":"user","content":"hi"}]}`))
		req.Header.Set("Authorization", "Bearer sk-alice")
		// No byte reached the proxy's client: the proxy drops the connection too.
		if resp, err := http.DefaultClient.Do(req); err == nil {
			_, _ = io.ReadAll(resp.Body)
			resp.Body.Close()
		}
		Eventually(minuteLevel(h)).Should(BeNumerically("~", 60000, 0.01))
		Expect(counter(h.m.Settlements.WithLabelValues("released"))).To(Equal(1.0))
	})

	It("settles a stream the client abandons on the input it reported plus the deltas it carried", func() {
		h := newHarness(streamDoc)
		h.llm.Set(fakellm.Behaviour{InputTokens: 100, OutputTokens: 1000, ChunkDelay: 5 * time.Millisecond})
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "POST", h.front.URL+"/v1/messages",
			strings.NewReader(`{"model":"c","stream":true,"max_tokens":2000,"messages":[{"role":"user","content":"hi"}]}`))
		req.Header.Set("x-api-key", "sk-alice")
		resp, err := http.DefaultClient.Do(req)
		Expect(err).NotTo(HaveOccurred())
		sc := bufio.NewScanner(resp.Body)
		for i := 0; i < 10 && sc.Scan(); i++ {
		}
		Expect(minuteLevel(h)()).To(BeNumerically("<", 60000-2000), "the hold is taken while the stream runs")
		cancel()
		resp.Body.Close()
		Eventually(func() float64 { return counter(h.m.Settlements.WithLabelValues("settled")) }).Should(Equal(1.0))
		Expect(counter(h.m.Settlements.WithLabelValues("released"))).To(Equal(0.0))
		// message_start reported 100 input tokens; each delta the proxy passed is 2.
		Expect(minuteLevel(h)()).To(BeNumerically("<=", 60000-100-2))
		Expect(minuteLevel(h)()).To(BeNumerically(">", 60000-100-2*1000))
	})
})

var _ = Describe("Failures and bad input", func() {
	It("answers 502 in the route's shape and releases when the upstream is down", func() {
		h := newHarness(streamDoc)
		h.backend.Close()
		r := h.chat("sk-alice", 100)
		Expect(r.code).To(Equal(502))
		Expect(r.errorField("error", "code")).To(Equal("upstream_unavailable"))
		Expect(minuteLevel(h)()).To(BeNumerically("~", 60000, 0.01))
		Expect(counter(h.m.UpstreamErrors.WithLabelValues("default"))).To(Equal(1.0))
	})

	It("answers 504 when the upstream does not answer in time", func() {
		h := newHarness(`
upstreams: [{name: default, url: UPSTREAM, timeout_seconds: 1}]
api_keys: [{name: alice, key_sha256: HASH(alice)}]
rate_limiting:
  budget_division: {replicas: 1}
  limits:
    per_api_key: {tokens_per_minute: 60000}
`)
		h.llm.Set(fakellm.Behaviour{Latency: 1500 * time.Millisecond})
		r := h.chat("sk-alice", 100)
		Expect(r.code).To(Equal(504))
		Expect(minuteLevel(h)()).To(BeNumerically("~", 60000, 0.01))
	})

	It("refuses a body over max_body_bytes with 413 and forwards nothing", func() {
		h := newHarness(strings.Replace(streamDoc, "upstreams:", "max_body_bytes: 100\nupstreams:", 1))
		r := h.chat("sk-alice", 10, `,"padding":"`+strings.Repeat("x", 200)+`"`)
		Expect(r.code).To(Equal(413))
		Expect(r.errorField("error", "code")).To(Equal("request_too_large"))
		Expect(h.llm.Requests()).To(BeEmpty())
	})

	It("forwards a body that is not JSON but charges it conservatively", func() {
		h := newHarness(streamDoc)
		h.llm.Set(fakellm.Behaviour{OmitUsage: true})
		body := `{"model":"m","messages":[{"role":"user","content":"hi"}],"temperature":NaN}`
		r := h.do("POST", "/v1/chat/completions", "sk-alice", body)
		Expect(r.code).To(Equal(200))
		Expect(h.llm.Requests()[0].Body).To(Equal([]byte(body)), "every byte is replayed")
		Expect(counter(h.m.TokenBudgetTokens.WithLabelValues("api_key", "reserved"))).To(Equal(float64((len(body)+2)/3 + 4096)))
	})

	It("forwards other paths with the request-count limits only", func() {
		h := newHarness(keysDoc + `
  limits:
    per_api_key: {requests_per_second: 1, burst_capacity: 2, tokens_per_minute: 1}
`)
		Expect(h.do("GET", "/v1/models", "sk-alice", "").code).To(Equal(200))
		Expect(h.do("GET", "/v1/models", "sk-alice", "").code).To(Equal(200))
		r := h.do("GET", "/v1/models", "sk-alice", "")
		Expect(r.code).To(Equal(429))
		Expect(r.errorField("error", "limit_type")).To(Equal("requests"))
		Expect(r.header.Get("X-Ratelimit-Tokens-Limit")).To(BeEmpty(), "no token budget is involved")
		_, ok := h.store.Level(budget.Key{Kind: budget.TokensMinute, Dim: budget.APIKey, ID: "alice"})
		Expect(ok).To(BeFalse(), "a route that is not charged touches no token bucket")
	})
})
