// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"context"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/openai/openai-go/v3/option"

	"github.com/tokenwarden/tokenwarden/test/fakellm"
	"github.com/tokenwarden/tokenwarden/test/stack"
)

// scraped sums the samples of the metric name whose labels include every one of
// labels (`result="hit"`), read from the proxy's /metrics.
func scraped(p *stack.Proxy, name string, labels ...string) float64 {
	GinkgoHelper()
	resp, err := http.Get(p.AdminURL + "/metrics")
	Expect(err).NotTo(HaveOccurred())
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	Expect(err).NotTo(HaveOccurred())
	line := regexp.MustCompile(`^` + name + `(\{[^}]*\})? (\S+)$`)
	sum := 0.0
	for _, l := range strings.Split(string(b), "\n") {
		m := line.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		all := true
		for _, want := range labels {
			all = all && strings.Contains(m[1], want)
		}
		if all {
			v, err := strconv.ParseFloat(m[2], 64)
			Expect(err).NotTo(HaveOccurred())
			sum += v
		}
	}
	return sum
}

var _ = Describe("The response cache through an official SDK", func() {
	It("answers the second identical OpenAI chat completion from the cache, with no backend call and nothing charged", func() {
		ns := namespace()
		p := fleet(ns, 1, "{type: Memory}", budgetManifest("per-key", "PerAPIKey", 1000000))[0]
		_, err := st.Kubectl("patch", "-n", ns, "tokenproxy", "fleet", "--type", "merge", "-p", `{"spec":{"cache":{"storage":"Memory"}}}`)
		Expect(err).NotTo(HaveOccurred())
		enforced(ns)
		st.LLM.Reset()
		st.LLM.Set(fakellm.Behaviour{InputTokens: 120, OutputTokens: 30})
		ctx := context.Background()
		c := openaiClient(p, "sk-e2e-alice", 0)
		params := chatParams(200)
		params.Messages[0].OfUser.Content.OfString.Value = "Summarise the catalogue for the cache."

		var first, second *http.Response
		a, err := c.Chat.Completions.New(ctx, params, option.WithResponseInto(&first))
		Expect(err).NotTo(HaveOccurred())
		Expect(first.Header.Get("X-Tokenwarden-Cache")).To(Equal("miss"))
		Eventually(func() float64 { return scraped(p, "tokenwarden_settlements_total", `result="settled"`) }).Should(Equal(1.0))

		b, err := c.Chat.Completions.New(ctx, params, option.WithResponseInto(&second))
		Expect(err).NotTo(HaveOccurred())
		Expect(second.Header.Get("X-Tokenwarden-Cache")).To(Equal("hit"))
		Expect(second.Header.Get("Age")).NotTo(BeEmpty())
		Expect(b.Choices[0].Message.Content).To(Equal(a.Choices[0].Message.Content))
		Expect(b.Usage.PromptTokens).To(Equal(int64(120)), "the stored answer, as the SDK reads it")
		Expect(st.LLM.Requests()).To(HaveLen(1), "one backend call for the two")

		Expect(scraped(p, "tokenwarden_settlements_total", `result="released"`)).To(Equal(1.0), "the hit's hold is released")
		Expect(scraped(p, "tokenwarden_settlements_total", `result="settled"`)).To(Equal(1.0), "only the miss settled: the hit charged nothing")
		Expect(scraped(p, "tokenwarden_cache_requests_total", `result="hit"`)).To(Equal(1.0))
		Expect(scraped(p, "tokenwarden_cache_saved_tokens_total")).To(Equal(150.0), "the hit saved the answer's 120 input and 30 output tokens")
	})
})
