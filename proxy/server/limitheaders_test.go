// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package server_test

import (
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/tokenwarden/tokenwarden/test/fakellm"
)

var _ = Describe("The proxy's own headers on an upstream's answer", func() {
	It("replace the same headers of an upstream (another tokenwarden in front of it) and keep the upstream's others", func() {
		h := newHarness(keysDoc + `
  limits:
    per_api_key: {tokens_per_minute: 6000}
  rules:
  - {name: watch-keys, dimension: api_key, action: warn, windows: [{limit: 1, rolling: {period: minute}}]}
`)
		h.llm.Set(fakellm.Behaviour{InputTokens: 1, OutputTokens: 1, Header: map[string]string{
			"X-Tokenwarden-Budget-Warning": "upstream-rule;window=minute",
			"X-Ratelimit-Tokens-Remaining": "12345",
			"X-Upstream-Own":               "kept",
		}})
		r := h.chat("sk-alice", 10)
		Expect(r.code).To(Equal(200))
		Expect(r.header.Values("X-Tokenwarden-Budget-Warning")).To(Equal([]string{"watch-keys;window=minute"}))
		Expect(r.header.Values("X-Ratelimit-Tokens-Remaining")).To(HaveLen(1))
		Expect(r.header.Get("X-Ratelimit-Tokens-Remaining")).NotTo(Equal("12345"))
		Expect(r.header.Values("X-Upstream-Own")).To(Equal([]string{"kept"}))
	})

	It("never pass on an upstream's own tokenwarden headers, which speak of another fleet's rules and upstreams", func() {
		h := newHarness(keysDoc)
		h.llm.Set(fakellm.Behaviour{InputTokens: 1, OutputTokens: 1, Header: map[string]string{
			"X-Tokenwarden-Budget-Warning": "upstream-rule;window=minute",
			"X-Tokenwarden-Fallback":       "gpt-4o",
			"X-Tokenwarden-Upstream":       "their-secret-backend",
			"X-Tokenwarden-Request-Id":     "theirs",
			"X-Tokenwarden-Anything":       "theirs",
			"X-Upstream-Own":               "kept",
		}})
		r := h.chat("sk-alice", 10)
		Expect(r.code).To(Equal(200))
		for _, name := range []string{"X-Tokenwarden-Budget-Warning", "X-Tokenwarden-Fallback", "X-Tokenwarden-Upstream", "X-Tokenwarden-Anything"} {
			Expect(r.header.Values(name)).To(BeEmpty(), name)
		}
		Expect(r.header.Values("X-Tokenwarden-Request-Id")).To(HaveLen(1))
		Expect(r.header.Get("X-Tokenwarden-Request-Id")).NotTo(Equal("theirs"))
		Expect(r.header.Values("X-Upstream-Own")).To(Equal([]string{"kept"}))
	})
})
