// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package server_test

import (
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/test/fakellm"
)

// clientDoc is a per_client minute budget of 1,000 tokens for anonymous clients behind
// a trusted proxy on loopback, whose X-Forwarded-For names the client.
func clientDoc(extra string) string {
	return `
upstreams: [{name: default, url: UPSTREAM}]
auth: {mode: optional, trusted_proxies: ["127.0.0.1/32"]}
rate_limiting:
  budget_division: {replicas: 1}
` + extra + `
  limits:
    per_client: {tokens_per_minute: 1000}
`
}

var _ = Describe("The per_client identity", func() {
	// from sends a chat request (reserving 108 tokens) as the client at addr.
	from := func(h *harness, addr string) int {
		return h.do("POST", "/v1/chat/completions", "", `{"model":"m","messages":[{"role":"user","content":"hello there"}],"max_tokens":100}`,
			"X-Forwarded-For", addr).code
	}

	DescribeTable("groups IPv6 clients by their prefix, and IPv4 clients by address",
		func(extra, first, second string, identity string, shared bool) {
			h := newHarness(clientDoc(extra))
			h.llm.Set(fakellm.Behaviour{InputTokens: 950, OutputTokens: 20}) // settles at 970: 30 left
			Expect(from(h, first)).To(Equal(200))
			Eventually(func() float64 { return h.level(budget.TokensMinute, budget.Client, identity, 1000) }).
				Should(BeNumerically("~", 30, 0.01), "the first client's bucket is %s", identity)
			if shared {
				Expect(from(h, second)).To(Equal(429), "%s is the same client as %s", second, first)
			} else {
				Expect(from(h, second)).To(Equal(200), "%s is another client than %s", second, first)
			}
		},
		Entry("two addresses in one /64 (the default) are one client", "",
			"2001:db8:1:2::1", "2001:db8:1:2:ffff:ffff:ffff:fffe", "2001:db8:1:2::/64", true),
		Entry("addresses in two /64s are two clients", "",
			"2001:db8:1:2::1", "2001:db8:1:3::1", "2001:db8:1:2::/64", false),
		Entry("a /48 prefix groups a whole site", "  client_ipv6_prefix: 48",
			"2001:db8:1:2::1", "2001:db8:1:ffff::1", "2001:db8:1::/48", true),
		Entry("a /128 prefix makes every address a client", "  client_ipv6_prefix: 128",
			"2001:db8::1", "2001:db8::2", "2001:db8::1/128", false),
		Entry("IPv4 clients are one per address", "",
			"192.0.2.1", "192.0.2.2", "192.0.2.1", false),
		Entry("an IPv4-mapped IPv6 address is the IPv4 client", "",
			"::ffff:192.0.2.1", "192.0.2.1", "192.0.2.1", true),
	)

	It("still matches the whitelist against the full address", func() {
		h := newHarness(clientDoc(`  whitelist: ["2001:db8:1:2::1/128"]`))
		h.llm.Set(fakellm.Behaviour{InputTokens: 950, OutputTokens: 20})
		for range 3 {
			Expect(from(h, "2001:db8:1:2::1")).To(Equal(200), "the whitelisted address is exempt")
		}
		_, ok := h.store.Level(budget.Key{Kind: budget.TokensMinute, Dim: budget.Client, ID: "2001:db8:1:2::/64"})
		Expect(ok).To(BeFalse(), "and charges nothing to its /64")
		Expect(from(h, "2001:db8:1:2::2")).To(Equal(200))
		Expect(from(h, "2001:db8:1:2::3")).To(Equal(429), "its neighbours are one client, and not exempt")
	})
})
