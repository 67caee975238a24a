// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package config_test

import (
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/tokenwarden/tokenwarden/proxy/config"
)

const registryDoc = `
upstreams:
- {name: openai-a, url: "http://127.0.0.1:8000", provider: openai}
- {name: openai-b, url: "http://127.0.0.1:8001", provider: openai}
- {name: claude, url: "http://127.0.0.1:8002", provider: anthropic, models: [claude-sonnet]}
- {name: rest, url: "http://127.0.0.1:8003"}
models:
- name: gpt-4o
  context_window: 128000
  max_output_tokens: 16384
  upstreams:
  - {upstream: openai-a}
  - {upstream: openai-b, provider_model: gpt-4o-2024-08-06}
`

var _ = Describe("The model registry", func() {
	It("reads each model's window, output cap and ordered upstreams; a registry upstream is never the catch-all", func() {
		c, err := config.Parse([]byte(registryDoc + `
- {name: gpt-4o-mini, upstreams: [{upstream: openai-b}]}
`))
		Expect(err).NotTo(HaveOccurred())
		Expect(c.Models[0].ContextWindow).To(Equal(int64(128000)))
		Expect(c.Models[0].MaxOutputTokens).To(Equal(int64(16384)))
		Expect(c.ModelUpstreamsFor("gpt-4o")).To(Equal([]config.ModelUpstream{{Upstream: "openai-a"}, {Upstream: "openai-b", ProviderModel: "gpt-4o-2024-08-06"}}))
		Expect(c.ModelUpstreamsFor("claude-sonnet")).To(Equal([]config.ModelUpstream{{Upstream: "claude"}}))
		Expect(c.ModelUpstreamsFor("llama")).To(Equal([]config.ModelUpstream{{Upstream: "rest"}}),
			"the first upstream with no models that no registry entry names serves every other model")
	})

	It("reads a model's tokenizer", func() {
		c, err := config.Parse([]byte(registryDoc + `
- {name: gpt-4.1, tokenizer: o200k_base}
- {name: gpt-4, tokenizer: cl100k_base}
`))
		Expect(err).NotTo(HaveOccurred())
		Expect(c.Models[0].Tokenizer).To(BeEmpty())
		Expect(c.Models[1].Tokenizer).To(Equal("o200k_base"))
		Expect(c.Models[2].Tokenizer).To(Equal("cl100k_base"))
	})

	It("reads each upstream's encoding, the model's where it names none", func() {
		c, err := config.Parse([]byte(registryDoc + `
- {name: group, tokenizer: o200k_base, upstreams: [{upstream: openai-a}, {upstream: rest, tokenizer: cl100k_base}]}
`))
		Expect(err).NotTo(HaveOccurred())
		g := &c.Models[1]
		Expect(g.Tokenized()).To(BeTrue())
		Expect([]string{g.Encoding(0), g.Encoding(1)}).To(Equal([]string{"o200k_base", "cl100k_base"}))
		Expect(c.Models[0].Tokenized()).To(BeFalse())
	})

	DescribeTable("refuses a bad registry, naming the field",
		func(extra, want string) {
			_, err := config.Parse([]byte(registryDoc + extra))
			Expect(err).To(HaveOccurred())
			Expect(err.Error()).To(ContainSubstring(want))
		},
		Entry("an upstream that is not in upstreams", `- {name: m, upstreams: [{upstream: nowhere}]}`,
			`models[1].upstreams[0].upstream: no entry of upstreams is named "nowhere"`),
		Entry("an upstream named twice", `- {name: m, upstreams: [{upstream: openai-a}, {upstream: openai-a}]}`,
			`models[1].upstreams[1].upstream: "openai-a" is also models[1].upstreams[0]`),
		Entry("a model listed both by an upstream and in the registry", `- {name: claude-sonnet, upstreams: [{upstream: claude}]}`,
			`models[1].upstreams: model "claude-sonnet" is also listed by upstreams[2].models`),
		Entry("an output cap beyond the window", `- {name: m, context_window: 1000, max_output_tokens: 2000}`,
			`models[1].max_output_tokens: 2000 is larger than the context_window 1000`),
		Entry("a negative window", `- {name: m, context_window: -1}`, `models[1].context_window: must not be negative`),
		Entry("a tokenizer the proxy does not have", `- {name: m, tokenizer: p50k_base}`,
			`models[1].tokenizer: unknown word "p50k_base": must be one of o200k_base, cl100k_base`),
		Entry("an upstream's tokenizer the proxy does not have", `- {name: m, upstreams: [{upstream: openai-a, tokenizer: p50k_base}]}`,
			`models[1].upstreams[0].tokenizer: unknown word "p50k_base"`),
		Entry("a tokenizer-mode model with an Anthropic candidate", `- {name: m, tokenizer: o200k_base, upstreams: [{upstream: openai-a}, {upstream: claude}]}`,
			`models[1].upstreams[1]: upstream "claude" speaks the Anthropic API: no encoding here counts its tokens, and model "m" is in tokenizer mode`),
		Entry("an Anthropic candidate naming an encoding", `- {name: m, upstreams: [{upstream: claude, tokenizer: cl100k_base}]}`,
			`models[1].upstreams[0]: upstream "claude" speaks the Anthropic API`),
		Entry("a candidate without an encoding beside one with", `- {name: m, upstreams: [{upstream: openai-a, tokenizer: o200k_base}, {upstream: rest}]}`,
			`models[1].upstreams[1].tokenizer: model "m" is in tokenizer mode and upstream "rest" has no encoding: name one here or in models[1].tokenizer`),
		Entry("an unknown provider", `- {name: m}
upstreams_extra: 1`, `upstreams_extra: unknown field`),
	)

	It("refuses an unknown provider word", func() {
		_, err := config.Parse([]byte(`
upstreams:
- {name: a, url: "http://127.0.0.1:8000", provider: gemini}
`))
		Expect(err).To(MatchError(ContainSubstring(`upstreams[0].provider: unknown word "gemini": must be one of openai, anthropic`)))
	})
})

var _ = Describe("The registry in the warnings", func() {
	It("counts a model the registry routes as served, and warns of one nothing serves", func() {
		c, err := config.Parse([]byte(`
upstreams:
- {name: a, url: "http://127.0.0.1:8000"}
- {name: b, url: "http://127.0.0.1:8001", models: [m]}
models:
- {name: gpt-4o, upstreams: [{upstream: a}]}
rate_limiting:
  budget_division: {replicas: 1}
  limits:
    per_model:
      gpt-4o: {tokens_per_minute: 1000}
      llama: {tokens_per_minute: 1000}
`))
		Expect(err).NotTo(HaveOccurred())
		Expect(c.Warnings()).To(ConsistOf(`rate_limiting.limits.per_model["llama"]: no upstream serves this model, so the budget never applies`))
	})
})
