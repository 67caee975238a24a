// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	anthropicoption "github.com/anthropics/anthropic-sdk-go/v2/option"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"

	"github.com/tokenwarden/tokenwarden/test/fakellm"
	"github.com/tokenwarden/tokenwarden/test/redisserver"
	"github.com/tokenwarden/tokenwarden/test/stack"
)

func openaiClient(p *stack.Proxy, key string, retries int) *openai.Client {
	c := openai.NewClient(option.WithBaseURL(p.URL+"/v1/"), option.WithAPIKey(key), option.WithMaxRetries(retries))
	return &c
}

func anthropicClient(p *stack.Proxy, key string, retries ...int) *anthropic.Client {
	n := 0
	if len(retries) > 0 {
		n = retries[0]
	}
	c := anthropic.NewClient(anthropicoption.WithBaseURL(p.URL+"/"), anthropicoption.WithAPIKey(key), anthropicoption.WithMaxRetries(n))
	return &c
}

func chatParams(maxTokens int64) openai.ChatCompletionNewParams {
	return openai.ChatCompletionNewParams{
		Model:     "demo",
		Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Summarise the catalogue.")},
		MaxTokens: openai.Int(maxTokens),
	}
}

// statusOf is the HTTP status of an SDK error, or 200 for none.
func statusOf(err error) int {
	if err == nil {
		return 200
	}
	var oe *openai.Error
	if errors.As(err, &oe) {
		return oe.StatusCode
	}
	var ae *anthropic.Error
	if errors.As(err, &ae) {
		return ae.StatusCode
	}
	return -1
}

var _ = Describe("The official SDKs through a fleet", Ordered, func() {
	var p *stack.Proxy
	ctx := context.Background()
	BeforeAll(func() {
		ns := namespace()
		p = fleet(ns, 1, "{type: Memory}", budgetManifest("per-key", "PerAPIKey", 1000000))[0]
		st.LLM.Set(fakellm.Behaviour{InputTokens: 120, OutputTokens: 30})
	})

	It("answers an OpenAI chat completion and reports its budget headers", func() {
		var raw *http.Response
		resp, err := openaiClient(p, "sk-e2e-alice", 0).Chat.Completions.New(ctx, chatParams(200), option.WithResponseInto(&raw))
		Expect(err).NotTo(HaveOccurred())
		Expect(resp.Usage.PromptTokens).To(Equal(int64(120)))
		Expect(resp.Choices[0].Message.Content).To(HavePrefix("word"))
		Expect(raw.Header.Get("X-Ratelimit-Limit-Tokens")).To(Equal("1000000"))
	})

	It("streams an OpenAI chat completion with usage", func() {
		params := chatParams(200)
		params.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
		stream := openaiClient(p, "sk-e2e-alice", 0).Chat.Completions.NewStreaming(ctx, params)
		acc := openai.ChatCompletionAccumulator{}
		for stream.Next() {
			acc.AddChunk(stream.Current())
		}
		Expect(stream.Err()).NotTo(HaveOccurred())
		Expect(acc.Usage.CompletionTokens).To(Equal(int64(30)))
		Expect(strings.Count(acc.Choices[0].Message.Content, "word")).To(Equal(30))
	})

	It("answers the Responses API", func() {
		resp, err := openaiClient(p, "sk-e2e-alice", 0).Responses.New(ctx, responses.ResponseNewParams{
			Model: "demo", Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("hi")}, MaxOutputTokens: openai.Int(100),
		})
		Expect(err).NotTo(HaveOccurred())
		Expect(resp.Usage.InputTokens).To(Equal(int64(120)))
		Expect(resp.OutputText()).To(HavePrefix("word"))
	})

	It("answers and streams Anthropic messages", func() {
		c := anthropicClient(p, "sk-e2e-bob")
		params := anthropic.MessageNewParams{Model: "claude-demo", MaxTokens: 200,
			Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("hi"))}}
		msg, err := c.Messages.New(ctx, params)
		Expect(err).NotTo(HaveOccurred())
		Expect(msg.Usage.InputTokens).To(Equal(int64(120)))

		stream := c.Messages.NewStreaming(ctx, params)
		acc := anthropic.Message{}
		for stream.Next() {
			Expect(acc.Accumulate(stream.Current())).To(Succeed())
		}
		Expect(stream.Err()).NotTo(HaveOccurred())
		Expect(acc.Usage.OutputTokens).To(Equal(int64(30)))
	})

	It("fails at once, without the SDKs' retries, on a request larger than the key's whole budget", func() {
		st.LLM.Reset()
		start := time.Now()
		var raw *http.Response
		_, err := openaiClient(p, "sk-e2e-alice", 2).Chat.Completions.New(ctx, chatParams(2000000), option.WithResponseInto(&raw))
		Expect(statusOf(err)).To(Equal(429))
		Expect(raw.Header.Get("X-Should-Retry")).To(Equal("false"))
		var oe *openai.Error
		Expect(errors.As(err, &oe)).To(BeTrue())
		Expect(oe.Message).To(ContainSubstring("more than the whole minute budget of the api_key dimension holds (1000000 tokens)"))
		// A stream: the Anthropic SDK refuses so large a ceiling without one.
		stream := anthropicClient(p, "sk-e2e-bob", 2).Messages.NewStreaming(ctx, anthropic.MessageNewParams{Model: "claude-demo", MaxTokens: 2000000,
			Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("hi"))}})
		for stream.Next() {
		}
		Expect(statusOf(stream.Err())).To(Equal(429))
		// Two retries each after a Retry-After of over 100 s would take minutes; the
		// bound is loose only for a loaded machine.
		Expect(time.Since(start)).To(BeNumerically("<", 10*time.Second), "x-should-retry: false stopped the retries")
		Expect(st.LLM.Requests()).To(BeEmpty())
	})

	It("refuses an unknown key in each SDK's error shape", func() {
		_, err := openaiClient(p, "sk-nobody", 0).Chat.Completions.New(ctx, chatParams(10))
		Expect(statusOf(err)).To(Equal(401))
		_, err = anthropicClient(p, "sk-nobody").Messages.New(ctx, anthropic.MessageNewParams{Model: "c", MaxTokens: 5,
			Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("hi"))}})
		Expect(statusOf(err)).To(Equal(401))
		var ae *anthropic.Error
		Expect(errors.As(err, &ae)).To(BeTrue())
		Expect(ae.RawJSON()).To(ContainSubstring(`"authentication_error"`))
	})
})

var _ = Describe("Budgets across a fleet", func() {
	ctx := context.Background()

	It("lets the SDK's own retries honour Retry-After and then succeed", func() {
		ns := namespace()
		p := fleet(ns, 1, "{type: Memory}", `
apiVersion: tokenwarden.io/v1alpha1
kind: TokenBudget
metadata: {name: per-key}
spec: {proxyRef: {name: fleet}, dimension: PerAPIKey, requestsPerSecond: 1, burstCapacity: 1}
`)[0]
		st.LLM.Set(fakellm.Behaviour{InputTokens: 10, OutputTokens: 5})
		c := openaiClient(p, "sk-e2e-alice", 2)
		_, err := c.Chat.Completions.New(ctx, chatParams(10))
		Expect(err).NotTo(HaveOccurred())
		st.LLM.Reset()
		start := time.Now()
		_, err = c.Chat.Completions.New(ctx, chatParams(10)) // refused once with Retry-After: 1, then admitted
		Expect(err).NotTo(HaveOccurred())
		Expect(time.Since(start)).To(BeNumerically(">=", 800*time.Millisecond), "the SDK waited for the Retry-After")
		Expect(st.LLM.Requests()).To(HaveLen(1), "only the admitted attempt reached the backend")

		start = time.Now()
		_, err = anthropicClient(p, "sk-e2e-alice", 2).Messages.New(ctx, anthropic.MessageNewParams{Model: "claude-demo", MaxTokens: 10,
			Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("hi"))}})
		Expect(err).NotTo(HaveOccurred())
		Expect(time.Since(start)).To(BeNumerically(">=", 800*time.Millisecond), "the Anthropic SDK waited for the Retry-After too")
		Expect(st.LLM.Requests()).To(HaveLen(2))
	})

	It("admits the fleet total across three in-memory proxies, not three times it", func() {
		ns := namespace()
		proxies := fleet(ns, 3, "{type: Memory}", budgetManifest("global", "Global", 3000))
		// Each request settles at 1,000 tokens: one fits each replica's 1,000. It asks
		// for 500 so that the 1,000 a minute each replica refills would take 30 s to let
		// a second one in: the count does not depend on how fast the machine is.
		st.LLM.Set(fakellm.Behaviour{InputTokens: 1000, OutputTokens: 0})
		admitted := 0
		for round := 0; round < 3; round++ {
			for _, p := range proxies {
				_, err := openaiClient(p, "sk-e2e-alice", 0).Chat.Completions.New(ctx, chatParams(500))
				switch statusOf(err) {
				case 200:
					admitted++
				case 429:
				default:
					Fail("unexpected " + err.Error())
				}
			}
		}
		Expect(admitted).To(Equal(3), "3,000 tokens for the fleet, at 1,000 a request")
	})

	It("enforces one total across two proxies on one Redis", func() {
		redis := redisserver.Start(GinkgoT())
		ns := namespace()
		proxies := fleet(ns, 2, `{type: Redis, redis: {url: "`+redis.URL()+`"}}`, budgetManifest("global", "Global", 3000))
		// Each request settles at 1,000 and asks for 500: the 3,000 a minute the shared
		// buckets refill would take 10 s to let a fourth one in.
		st.LLM.Set(fakellm.Behaviour{InputTokens: 1000, OutputTokens: 0})
		admitted := 0
		for i := 0; i < 6; i++ {
			_, err := openaiClient(proxies[i%2], "sk-e2e-bob", 0).Chat.Completions.New(ctx, chatParams(500))
			if statusOf(err) == 200 {
				admitted++
			}
		}
		Expect(admitted).To(Equal(3), "the shared buckets hold 3,000 for the fleet; nothing is divided")
	})

	It("enforces a TokenBudget edit on every proxy, and reports how long that took", func() {
		ns := namespace()
		proxies := fleet(ns, 3, "{type: Memory}", budgetManifest("per-key", "PerAPIKey", 3000000))
		st.LLM.Set(fakellm.Behaviour{InputTokens: 10, OutputTokens: 5})
		before := enforced(ns)
		for _, p := range proxies {
			_, err := openaiClient(p, "sk-e2e-alice", 0).Chat.Completions.New(ctx, chatParams(1000))
			Expect(err).NotTo(HaveOccurred())
		}
		_, err := st.Kubectl("patch", "tb/per-key", "-n", ns, "--type=merge", "-p", `{"spec":{"tokensPerMinute":300}}`)
		Expect(err).NotTo(HaveOccurred())
		edited := time.Now()
		after := enforced(ns)
		Expect(after).To(BeNumerically(">", before), "the edit is a new generation of the fleet's config")
		applied := time.Since(edited)
		// The control plane tells the same from the replicas' own reports.
		Eventually(func(g Gomega) {
			out, err := st.Kubectl("get", "tp/fleet", "-n", ns, "-o",
				`jsonpath={.status.enforced} {.status.conditions[?(@.type=="Enforced")].status} {.status.configGeneration}`)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(out).To(Equal(fmt.Sprintf("3/3 True %d", after)))
			out, err = st.Kubectl("get", "tb/per-key", "-n", ns, "-o",
				`jsonpath={.status.conditions[?(@.type=="Enforced")].status} {.status.configGeneration}`)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(out).To(Equal(fmt.Sprintf("True %d", after)), "the edited budget is in generation %d, loaded by all", after)
			out, err = st.Kubectl("get", "ak/alice", "-n", ns, "-o", `jsonpath={.status.conditions[?(@.type=="Enforced")].status}`)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(out).To(Equal("True"))
		}).Should(Succeed())
		reported := time.Since(edited)
		// 100 tokens a minute per replica now: one request of 1,000 does not fit. Every
		// proxy holds the edit, so none should need a second try; Eventually only keeps
		// a loaded machine from failing the spec.
		for _, p := range proxies {
			Eventually(func() int {
				_, err := openaiClient(p, "sk-e2e-alice", 0).Chat.Completions.New(ctx, chatParams(1000))
				return statusOf(err)
			}).Should(Equal(429), "%s refuses what the edited budget does not hold", p)
		}
		refused := time.Since(edited)
		AddReportEntry("TokenBudget edit to every proxy", fmt.Sprintf("generation %d applied by all 3 proxies %v after the patch; Enforced=True on the TokenProxy and the budget after %v; all refusing after %v",
			after, applied.Round(time.Millisecond), reported.Round(time.Millisecond), refused.Round(time.Millisecond)))
		GinkgoWriter.Printf("A TokenBudget edit: generation %d applied by every proxy %v after the patch, enforced by all %v after it\n",
			after, applied, refused)
	})

	It("re-divides every budget when kubectl scales the fleet", func() {
		ns := namespace()
		Expect(fleet(ns, 2, "{type: Memory}", budgetManifest("per-key", "PerAPIKey", 12000))).To(HaveLen(2))
		out, err := st.Kubectl("get", "tb", "per-key", "-n", ns, "-o", "jsonpath={.status.perReplica.tokensPerMinute}")
		Expect(err).NotTo(HaveOccurred())
		Expect(out).To(Equal("6000"))
		_, err = st.Kubectl("scale", "tp/fleet", "-n", ns, "--replicas=3")
		Expect(err).NotTo(HaveOccurred())
		proxies, err := st.SyncProxies(ctx, ns, "fleet")
		Expect(err).NotTo(HaveOccurred())
		Expect(proxies).To(HaveLen(3))
		enforced(ns)
		Expect(stack.CheckDivisor(ctx, proxies, 3)).To(Succeed())
		Eventually(func(g Gomega) {
			out, err := st.Kubectl("get", "tp/fleet", "-n", ns, "-o", "jsonpath={.status.enforced}")
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(out).To(Equal("3/3"), "the third proxy reports itself")
		}).Should(Succeed())
		// One report Lease per proxy, owned by the fleet's ConfigMap: it goes with the fleet.
		out, err = st.Kubectl("get", "leases", "-n", ns, "-l", "tokenwarden.io/configmap=fleet-proxy", "-o",
			`jsonpath={range .items[*]}{.spec.holderIdentity}:{.metadata.ownerReferences[0].kind}/{.metadata.ownerReferences[0].name} {end}`)
		Expect(err).NotTo(HaveOccurred())
		Expect(strings.Fields(out)).To(ConsistOf("fleet-proxy-0:ConfigMap/fleet-proxy", "fleet-proxy-1:ConfigMap/fleet-proxy", "fleet-proxy-2:ConfigMap/fleet-proxy"))
		// The operator writes the budgets' statuses before the fleet's: once the fleet is
		// enforced, they show the new division.
		out, err = st.Kubectl("get", "tb", "per-key", "-n", ns, "-o", "jsonpath={.status.perReplica.tokensPerMinute}")
		Expect(err).NotTo(HaveOccurred())
		Expect(out).To(Equal("4000"))
	})
})
