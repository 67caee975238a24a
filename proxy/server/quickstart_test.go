// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package server_test

import (
	"os"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/test/fakellm"
)

// The README's first commands run `make run-proxy`: config/samples/proxy.yaml in
// front of a fake backend that reports 1,200 input and 300 output tokens.
var _ = Describe("The README's standalone proxy", func() {
	var h *harness
	BeforeEach(func() {
		sample, err := os.ReadFile("../../config/samples/proxy.yaml")
		Expect(err).NotTo(HaveOccurred())
		h = newHarness(strings.ReplaceAll(string(sample), "http://127.0.0.1:8000", "UPSTREAM"))
		h.llm.Set(fakellm.Behaviour{InputTokens: 1200, OutputTokens: 300})
	})

	It("serves alice within her budget, with 19482 tokens left of her minute", func() {
		r := h.do("POST", "/v1/chat/completions", "sk-demo-alice",
			`{"model":"demo","max_tokens":500,"messages":[{"role":"user","content":"hi"}]}`)
		Expect(r.code).To(Equal(200))
		Expect(r.header.Get("X-Ratelimit-Remaining-Tokens")).To(Equal("19482"))
		Expect(r.header.Get("X-Ratelimit-Tokens-Remaining")).To(Equal("19482"))
	})

	It("refuses the batch key's third call of 1,500 tokens within its 3,500 a minute", func() {
		var codes []int
		for i := range 3 {
			r := h.do("POST", "/v1/chat/completions", "sk-demo-batch", `{"model":"demo","max_tokens":1000}`)
			codes = append(codes, r.code)
			if r.code == 200 { // settled on the 1,500 tokens the backend reported
				Eventually(func() float64 { return h.level(budget.TokensMinute, budget.APIKey, "batch", 3500) }).
					Should(BeNumerically("~", 3500-1500*float64(i+1), 0.01))
			}
		}
		Expect(codes).To(Equal([]int{200, 200, 429}))
	})

	It("refuses a batch request larger than its whole minute budget as final: x-should-retry false, larger_than_budget", func() {
		r := h.do("POST", "/v1/messages", "", `{"model":"demo","max_tokens":5000,"messages":[{"role":"user","content":"hi"}]}`,
			"X-Api-Key", "sk-demo-batch", "Anthropic-Version", "2023-06-01")
		Expect(r.code).To(Equal(429))
		Expect(r.header.Get("X-Should-Retry")).To(Equal("false"))
		Expect(r.errorField("error", "details", "reason")).To(Equal("larger_than_budget"))
		Expect(r.header.Get("Retry-After")).NotTo(BeEmpty(), "kept as information")
		Expect(h.llm.Requests()).To(BeEmpty())
	})
})
