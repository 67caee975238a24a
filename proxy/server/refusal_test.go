// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package server_test

import (
	"strconv"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/tokenwarden/tokenwarden/test/fakellm"
)

// family is one API family's charged route, as a client calls it.
type family struct {
	name string
	ask  func(h *harness, key string, maxTokens int) reply
}

var (
	openAIChat = family{name: "OpenAI", ask: func(h *harness, key string, maxTokens int) reply {
		GinkgoHelper()
		return h.chat(key, maxTokens)
	}}
	anthropicMessages = family{name: "Anthropic", ask: func(h *harness, key string, maxTokens int) reply {
		GinkgoHelper()
		return h.do("POST", "/v1/messages", key, `{"model":"claude","max_tokens":`+itoa(maxTokens)+`,"messages":[{"role":"user","content":"hello there"}]}`)
	}}
)

// inBoth makes one entry per API family of each sentence: the refusal means the same
// in both shapes.
func inBoth(sentence string, args ...any) []TableEntry {
	return []TableEntry{
		Entry(sentence+" (OpenAI shape)", append([]any{openAIChat}, args...)...),
		Entry(sentence+" (Anthropic shape)", append([]any{anthropicMessages}, args...)...),
	}
}

// spend sends one request that settles at used tokens.
func spend(h *harness, f family, used int64) {
	GinkgoHelper()
	h.llm.Set(fakellm.Behaviour{InputTokens: used, OutputTokens: 0})
	Expect(f.ask(h, "sk-alice", 100).code).To(Equal(200))
	h.llm.Set(fakellm.Behaviour{InputTokens: 10, OutputTokens: 20})
}

var _ = Describe("A refusal that waiting cannot cure", func() {
	DescribeTable("says x-should-retry: false, keeps Retry-After and names the reason in the body",
		func(f family, limits string, spent int64, maxTokens int, reason string) {
			h := newHarness(keysDoc + limits)
			if spent > 0 {
				spend(h, f, spent)
			}
			r := f.ask(h, "sk-alice", maxTokens)
			Expect(r.code).To(Equal(429))
			Expect(r.header.Get("Retry-After")).NotTo(BeEmpty(), "Retry-After stays, as information")
			Expect(r.errorField("error", "details", "retryable")).To(Equal(reason == ""))
			if reason == "" {
				Expect(r.header.Values("X-Should-Retry")).To(BeEmpty(), "a wait within the client's patience lets the SDK retry")
				Expect(r.errorField("error", "details")).NotTo(HaveKey("reason"))
				return
			}
			Expect(r.header.Get("X-Should-Retry")).To(Equal("false"))
			Expect(r.errorField("error", "details", "reason")).To(Equal(reason))
			Expect(r.errorField("error", "message")).To(ContainSubstring("do not retry"))
			Expect(h.llm.Requests()).To(HaveLen(int(min(spent, 1))), "a refused request never reaches the backend")
		},
		inBoth("a request larger than the key's whole minute budget",
			"  limits:\n    per_api_key: {tokens_per_minute: 600}\n", int64(0), 700, "larger_than_budget"),
		inBoth("a request larger than a shared budget, whose size stays unsaid",
			"  limits:\n    global: {tokens_per_minute: 600}\n", int64(0), 700, "larger_than_budget"),
		inBoth("a day budget that refills in hours",
			"  limits:\n    per_team: {tokens_per_day: 1000}\n", int64(900), 200, "beyond_patience"),
		inBoth("a wait of about 30 s, under the default patience of 60 s",
			"  limits:\n    per_api_key: {tokens_per_minute: 600}\n", int64(500), 380, ""),
		inBoth("the same wait beyond a patience of 20 s",
			"  retry_patience_seconds: 20\n  limits:\n    per_api_key: {tokens_per_minute: 600}\n", int64(500), 380, "beyond_patience"),
		inBoth("a request-count refusal, cured in a second",
			"  limits:\n    per_api_key: {requests_per_second: 1, burst_capacity: 1}\n", int64(1), 10, ""),
	)

	It("tells the caller its whole budget and what to change", func() {
		h := newHarness(keysDoc + "  limits:\n    per_api_key: {tokens_per_minute: 600}\n")
		r := h.chat("sk-alice", 700)
		Expect(r.errorField("error", "message")).To(Equal("this request reserves " + strconv.Itoa(int(chatEstimate(700))) +
			" tokens, more than the whole minute budget of the api_key dimension holds (600 tokens): no wait lets it in, so do not retry it; send a smaller request (a lower max_tokens or a shorter input)"))
		Expect(r.errorField("error", "details", "capacity")).To(BeNumerically("==", 600))
		// Its own cost refilled: 721 tokens at 10 a second.
		Expect(r.header.Get("Retry-After")).To(Equal("73"))
	})

	It("never says a shared budget's size", func() {
		h := newHarness(keysDoc + "  limits:\n    global: {tokens_per_minute: 600}\n")
		r := h.chat("sk-alice", 700)
		Expect(r.errorField("error", "message")).To(ContainSubstring("more than the whole minute budget of the global dimension holds: "))
		Expect(r.errorField("error", "details")).NotTo(HaveKey("capacity"))
	})
})

var _ = Describe("Anthropic's rate limit headers", func() {
	const reset = time.RFC3339

	// at is the fake clock's start plus d, to the second, as Anthropic writes a reset.
	at := func(h *harness, d time.Duration) string { return h.clock.Now().Add(d).UTC().Format(reset) }

	DescribeTable("report the caller's own budget on an Anthropic route, in Anthropic's format",
		func(path string, anthropicNames bool) {
			h := newHarness(keysDoc + "  limits:\n    global: {tokens_per_minute: 1000000}\n    per_api_key: {tokens_per_minute: 6000, requests_per_second: 1, burst_capacity: 5}\n")
			h.llm.Set(fakellm.Behaviour{Latency: time.Millisecond, OmitUsage: true})
			r := h.do("POST", path, "sk-alice", `{"model":"claude","max_tokens":590,"messages":[{"role":"user","content":"hello there"}]}`)
			Expect(r.code).To(Equal(200))
			if !anthropicNames {
				for name := range r.header {
					Expect(name).NotTo(HavePrefix("Anthropic-Ratelimit"))
				}
				return
			}
			// The x-ratelimit-* family's budget, under Anthropic's names.
			Expect(r.header.Get("Anthropic-Ratelimit-Tokens-Limit")).To(Equal("6000"))
			Expect(r.header.Get("Anthropic-Ratelimit-Tokens-Remaining")).To(Equal(r.header.Get("X-Ratelimit-Tokens-Remaining")))
			remaining, err := strconv.Atoi(r.header.Get("Anthropic-Ratelimit-Tokens-Remaining"))
			Expect(err).NotTo(HaveOccurred())
			// Whole again once the reservation refills at 100 a second, rounded up.
			Expect(r.header.Get("Anthropic-Ratelimit-Tokens-Reset")).To(Equal(at(h, time.Duration((6000-remaining+99)/100)*time.Second)))
			Expect(r.header.Get("Anthropic-Ratelimit-Requests-Limit")).To(Equal("5"))
			Expect(r.header.Get("Anthropic-Ratelimit-Requests-Remaining")).To(Equal("4"))
			Expect(r.header.Get("Anthropic-Ratelimit-Requests-Reset")).To(Equal(at(h, time.Second)))
			Expect(r.header.Get("Anthropic-Ratelimit-Input-Tokens-Limit")).To(BeEmpty(), "no input-token budget exists to report")
		},
		Entry("on /v1/messages", "/v1/messages", true),
		Entry("on /anthropic/v1/messages", "/anthropic/v1/messages", true),
		Entry("not on an OpenAI route", "/v1/chat/completions", false),
	)

	It("report the refusing budget on a 429, with its reset", func() {
		h := newHarness(keysDoc + "  limits:\n    per_api_key: {tokens_per_minute: 600}\n")
		spend(h, anthropicMessages, 500)
		r := anthropicMessages.ask(h, "sk-alice", 380)
		Expect(r.code).To(Equal(429))
		Expect(r.header.Get("Anthropic-Ratelimit-Tokens-Limit")).To(Equal("600"))
		Expect(r.header.Get("Anthropic-Ratelimit-Tokens-Remaining")).To(Equal("100"))
		Expect(r.header.Get("Anthropic-Ratelimit-Tokens-Reset")).To(Equal(at(h, 50*time.Second)), "500 to refill at 10 a second")
	})

	It("report the day budget of a key that has no minute budget", func() {
		h := newHarness(keysDoc + "  limits:\n    per_api_key: {tokens_per_day: 864000}\n")
		r := anthropicMessages.ask(h, "sk-alice", 100)
		Expect(r.code).To(Equal(200))
		Expect(r.header.Get("Anthropic-Ratelimit-Tokens-Limit")).To(Equal("864000"))
		Expect(r.header.Get("Anthropic-Ratelimit-Tokens-Remaining")).To(Equal(r.header.Get("X-Ratelimit-Tokens-Day-Remaining")))
	})

	It("never report a shared dimension", func() {
		h := newHarness(keysDoc + "  limits:\n    global: {tokens_per_minute: 600, requests_per_second: 5}\n    per_team: {tokens_per_minute: 6000}\n")
		for _, code := range []int{200, 429} {
			r := anthropicMessages.ask(h, "sk-alice", 100)
			if code == 429 {
				r = anthropicMessages.ask(h, "sk-alice", 700)
			}
			Expect(r.code).To(Equal(code))
			for name := range r.header {
				Expect(name).NotTo(HavePrefix("Anthropic-Ratelimit"), "%d", code)
			}
		}
	})
})
