// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/tokenwarden/tokenwarden/test/fakellm"
	"github.com/tokenwarden/tokenwarden/test/redisserver"
	"github.com/tokenwarden/tokenwarden/test/stack"
)

// sentence is one budget as a platform team says it, written as TokenBudgets, and
// what a caller of the fleet then sees.
type sentence struct {
	// redis puts the fleet's counters in Redis (a calendar or cost budget needs it).
	redis bool
	// keys are the fleet's ApiKeys, by name: the caller's team.
	keys map[string]string
	// budgets are the TokenBudget manifests.
	budgets string
	// check sends traffic to the fleet's one proxy; ns names the budgets' namespace.
	check func(ns string, p *stack.Proxy)
}

// answer is a proxy's answer to one chat request.
type answer struct {
	code   int
	header http.Header
	err    struct {
		LimitType string         `json:"limit_type"`
		Code      string         `json:"code"`
		Message   string         `json:"message"`
		Details   map[string]any `json:"details"`
	}
}

// chat sends one OpenAI chat request for model with max_tokens to p as key NAME.
func chat(p *stack.Proxy, name, model string, maxTokens int) answer {
	GinkgoHelper()
	body := fmt.Sprintf(`{"model":%q,"max_tokens":%d,"messages":[{"role":"user","content":"Summarise the catalogue."}]}`, model, maxTokens)
	req, err := http.NewRequest("POST", p.URL+"/v1/chat/completions", strings.NewReader(body))
	Expect(err).NotTo(HaveOccurred())
	req.Header.Set("Authorization", "Bearer sk-e2e-"+name)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	Expect(err).NotTo(HaveOccurred())
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	Expect(err).NotTo(HaveOccurred())
	a := answer{code: resp.StatusCode, header: resp.Header}
	if resp.StatusCode != 200 {
		var e struct {
			Error json.RawMessage `json:"error"`
		}
		Expect(json.Unmarshal(b, &e)).To(Succeed(), "%s", b)
		Expect(json.Unmarshal(e.Error, &a.err)).To(Succeed(), "%s", b)
	}
	return a
}

// dollars parses a cost header.
func dollars(h http.Header, name string) float64 {
	GinkgoHelper()
	v, err := strconv.ParseFloat(h.Get(name), 64)
	Expect(err).NotTo(HaveOccurred(), "%s: %q", name, h.Get(name))
	return v
}

var _ = Describe("Rule sentences, applied with kubectl and enforced by a proxy process", func() {
	DescribeTable("a budget as a platform team says it",
		func(s sentence) {
			ns := namespace()
			storage := "{type: Memory}"
			if s.redis {
				storage = `{type: Redis, redis: {url: "` + redisserver.Start(GinkgoT()).URL() + `"}}`
			}
			manifest := fmt.Sprintf(`
apiVersion: tokenwarden.io/v1alpha1
kind: TokenProxy
metadata: {name: fleet}
spec:
  replicas: 1
  upstreams: [{name: fake, url: %q}]
  storage: %s
  models:
  - {name: gpt-4o, price: {input: "2.50", output: "10"}}
  - {name: claude, price: {input: "3", output: "15"}}
`, st.LLMURL, storage)
			for name, team := range s.keys {
				manifest += fmt.Sprintf(`---
apiVersion: v1
kind: Secret
metadata: {name: %[1]s-key, labels: {tokenwarden.io/secret: api-key}}
stringData: {key: sk-e2e-%[1]s}
---
apiVersion: tokenwarden.io/v1alpha1
kind: ApiKey
metadata: {name: %[1]s}
spec: {proxyRef: {name: fleet}, secretRef: {name: %[1]s-key}, user: %[1]s, team: %[2]s}
`, name, team)
			}
			apply(ns, manifest+"---\n"+s.budgets)
			proxies, err := st.SyncProxies(context.Background(), ns, "fleet")
			Expect(err).NotTo(HaveOccurred())
			enforced(ns)
			// Each request reports 10 input and 10 output tokens unless the row says
			// otherwise.
			st.LLM.Set(fakellm.Behaviour{InputTokens: 10, OutputTokens: 10})
			s.check(ns, proxies[0])
		},

		Entry("team A and team B with their own budgets, and a default for every other team", sentence{
			keys: map[string]string{"ana": "research", "ben": "support", "cem": "sales"},
			budgets: `
apiVersion: tokenwarden.io/v1alpha1
kind: TokenBudget
metadata: {name: teams}
spec: {proxyRef: {name: fleet}, dimension: PerTeam, windows: [{limit: "500", rolling: {period: Minute}}]}
---
apiVersion: tokenwarden.io/v1alpha1
kind: TokenBudget
metadata: {name: research}
spec: {proxyRef: {name: fleet}, dimension: PerTeam, subjects: [research], windows: [{limit: "3000", rolling: {period: Minute}}]}
---
apiVersion: tokenwarden.io/v1alpha1
kind: TokenBudget
metadata: {name: support}
spec: {proxyRef: {name: fleet}, dimension: PerTeam, subjects: [support], windows: [{limit: "1000", rolling: {period: Minute}}]}
`,
			check: func(ns string, p *stack.Proxy) {
				// A request reserving some 820 tokens fits research's and support's
				// budgets, not the default's 500.
				refused := chat(p, "cem", "gpt-4o", 800)
				Expect(refused.code).To(Equal(429), "sales has the default 500 a minute")
				Expect(refused.err.Details).To(HaveKeyWithValue("dimension", "team"))
				Expect(refused.err.Details).NotTo(HaveKey("rule"), "a team's budget is shared: never named")
				Expect(chat(p, "ben", "gpt-4o", 800).code).To(Equal(200), "support's 1,000 replaces the default")
				// Some 2,020 tokens: research's 3,000 holds them, support's 1,000 does not.
				Expect(chat(p, "ben", "gpt-4o", 2000).code).To(Equal(429))
				Expect(chat(p, "ana", "gpt-4o", 2000).code).To(Equal(200), "research's 3,000 replaces the default")
				Expect(chat(p, "cem", "gpt-4o", 100).code).To(Equal(200), "the default admits what fits")
			},
		}),

		Entry("per key per model: 2 requests a minute", sentence{
			keys: map[string]string{"dev": "apps"},
			budgets: `
apiVersion: tokenwarden.io/v1alpha1
kind: TokenBudget
metadata: {name: key-model-requests}
spec: {proxyRef: {name: fleet}, dimension: PerAPIKey, countBy: Model, amount: Requests, windows: [{limit: "2", rolling: {period: Minute}}]}
`,
			check: func(ns string, p *stack.Proxy) {
				first := chat(p, "dev", "gpt-4o", 10)
				Expect(first.code).To(Equal(200))
				Expect(first.header.Get("X-Ratelimit-Limit-Requests")).To(Equal("2"), "the key's own request budget")
				Expect(chat(p, "dev", "gpt-4o", 10).code).To(Equal(200))
				refused := chat(p, "dev", "gpt-4o", 10)
				Expect(refused.code).To(Equal(429))
				Expect(refused.err.Details).To(HaveKeyWithValue("rule", ns+"/key-model-requests"))
				Expect(refused.err.Details).To(HaveKeyWithValue("amount", "requests"))
				Expect(chat(p, "dev", "claude", 10).code).To(Equal(200), "another model has its own 2")
			},
		}),

		Entry("an output token limit: 100 generated tokens a minute per key", sentence{
			keys: map[string]string{"eve": "apps"},
			budgets: `
apiVersion: tokenwarden.io/v1alpha1
kind: TokenBudget
metadata: {name: key-output}
spec: {proxyRef: {name: fleet}, dimension: PerAPIKey, amount: OutputTokens, windows: [{limit: "100", rolling: {period: Minute}}]}
`,
			check: func(ns string, p *stack.Proxy) {
				ok := chat(p, "eve", "gpt-4o", 60)
				Expect(ok.code).To(Equal(200))
				Expect(ok.header.Get("X-Ratelimit-Output-Tokens-Limit")).To(Equal("100"))
				Expect(ok.header.Get("X-Ratelimit-Output-Tokens-Remaining")).To(Equal("40"), "the output ceiling is reserved")
				// However short the prompt, a ceiling of 200 generated tokens is more than
				// the whole budget.
				refused := chat(p, "eve", "gpt-4o", 200)
				Expect(refused.code).To(Equal(429))
				Expect(refused.err.Details).To(HaveKeyWithValue("rule", ns+"/key-output"))
				Expect(refused.err.Details).To(HaveKeyWithValue("amount", "output_tokens"))
			},
		}),

		Entry("$25 a month per key on gpt-4o, refused at the dollar", sentence{
			redis: true,
			keys:  map[string]string{"fay": "apps"},
			budgets: `
apiVersion: tokenwarden.io/v1alpha1
kind: TokenBudget
metadata: {name: key-gpt-4o-dollars}
spec: {proxyRef: {name: fleet}, dimension: PerAPIKey, models: [gpt-4o], amount: Cost, windows: [{limit: "25", calendar: {every: Month}}]}
`,
			check: func(ns string, p *stack.Proxy) {
				// 1.6M input tokens at $2.50 and 2M output tokens at $10: $24.
				st.LLM.Set(fakellm.Behaviour{InputTokens: 1_600_000, OutputTokens: 2_000_000})
				first := chat(p, "fay", "gpt-4o", 100)
				Expect(first.code).To(Equal(200))
				Expect(first.header.Get("X-Tokenwarden-Budget-Cost-Limit")).To(Equal("25"))
				st.LLM.Set(fakellm.Behaviour{InputTokens: 1, OutputTokens: 1})
				// Once the $24 is settled, $1 is left (less what each probe reserves).
				Eventually(func() float64 {
					return dollars(chat(p, "fay", "gpt-4o", 1).header, "X-Tokenwarden-Budget-Cost-Remaining")
				}).Should(BeNumerically("<", 1.001))
				// 150,000 output tokens at $10 a million reserve $1.50: more than is left.
				refused := chat(p, "fay", "gpt-4o", 150_000)
				Expect(refused.code).To(Equal(429))
				Expect(refused.err.LimitType).To(Equal("cost_budget"))
				Expect(refused.err.Details).To(HaveKeyWithValue("rule", ns+"/key-gpt-4o-dollars"))
				Expect(refused.err.Details).To(HaveKeyWithValue("window", "calendar_month"))
				wait, err := strconv.Atoi(refused.header.Get("Retry-After"))
				Expect(err).NotTo(HaveOccurred())
				Expect(time.Duration(wait)*time.Second).To(BeNumerically("<=", 31*24*time.Hour), "until the month's end")
				// 50,000 reserve $0.50: admitted, with what is left.
				ok := chat(p, "fay", "gpt-4o", 50_000)
				Expect(ok.code).To(Equal(200))
				Expect(dollars(ok.header, "X-Tokenwarden-Budget-Cost-Remaining")).To(BeNumerically("~", 0.5, 0.01))
				Expect(chat(p, "fay", "claude", 150_000).code).To(Equal(200), "the budget governs gpt-4o only")
			},
		}),

		Entry("a Warn budget never refuses, and says so in a header", sentence{
			keys: map[string]string{"gus": "apps"},
			budgets: `
apiVersion: tokenwarden.io/v1alpha1
kind: TokenBudget
metadata: {name: watch-keys}
spec: {proxyRef: {name: fleet}, dimension: PerAPIKey, action: Warn, windows: [{limit: "100", rolling: {period: Minute}}]}
`,
			check: func(ns string, p *stack.Proxy) {
				quiet := chat(p, "gus", "gpt-4o", 10)
				Expect(quiet.code).To(Equal(200))
				Expect(quiet.header.Values("X-Tokenwarden-Budget-Warning")).To(BeEmpty(), "it fits")
				for range 3 {
					loud := chat(p, "gus", "gpt-4o", 500)
					Expect(loud.code).To(Equal(200), "warn never refuses")
					Expect(loud.header.Get("X-Tokenwarden-Budget-Warning")).To(Equal(ns + "/watch-keys;window=minute"))
				}
			},
		}),
	)
})
