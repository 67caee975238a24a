// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package fakellm_test

import (
	"context"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/anthropics/anthropic-sdk-go/v2"
	anthropicoption "github.com/anthropics/anthropic-sdk-go/v2/option"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"

	"github.com/tokenwarden/tokenwarden/test/fakellm"
)

func TestFakeLLM(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "Fake LLM Suite")
}

// The streams carry what the official SDKs' stream helpers accumulate; the Node SDKs'
// helpers are exercised through the proxy by the end-to-end suite.
var _ = Describe("The fake backend's streams", func() {
	ctx := context.Background()
	var (
		llm *fakellm.Server
		oc  openai.Client
		ac  anthropic.Client
	)
	BeforeEach(func() {
		llm = fakellm.New()
		llm.Set(fakellm.Behaviour{InputTokens: 7, OutputTokens: 3})
		srv := httptest.NewServer(llm)
		DeferCleanup(srv.Close)
		oc = openai.NewClient(option.WithBaseURL(srv.URL+"/v1/"), option.WithAPIKey("k"), option.WithMaxRetries(0))
		ac = anthropic.NewClient(anthropicoption.WithBaseURL(srv.URL+"/"), anthropicoption.WithAPIKey("k"), anthropicoption.WithMaxRetries(0))
	})

	It("names the role in the first chat delta, and the accumulated completion matches the deltas", func() {
		stream := oc.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{Model: "m",
			Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}})
		var acc openai.ChatCompletionAccumulator
		var roles []string
		for stream.Next() {
			c := stream.Current()
			acc.AddChunk(c)
			if len(c.Choices) > 0 && c.Choices[0].Delta.Role != "" {
				roles = append(roles, c.Choices[0].Delta.Role)
			}
		}
		Expect(stream.Err()).NotTo(HaveOccurred())
		Expect(roles).To(Equal([]string{"assistant"}), "the first delta, and only it, names the role")
		Expect(acc.Choices[0].Message.Content).To(Equal("word word word "))
		Expect(acc.Choices[0].FinishReason).To(Equal("stop"))
		Expect(acc.Usage.PromptTokens).To(Equal(int64(7)))
	})

	It("names the role in a chat stream without deltas", func() {
		llm.Set(fakellm.Behaviour{InputTokens: 7})
		stream := oc.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{Model: "m",
			Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}})
		var role string
		for stream.Next() {
			if c := stream.Current(); len(c.Choices) > 0 && c.Choices[0].Delta.Role != "" {
				role = c.Choices[0].Delta.Role
			}
		}
		Expect(stream.Err()).NotTo(HaveOccurred())
		Expect(role).To(Equal("assistant"))
	})

	It("streams a Responses answer as its item events, ending with the whole output", func() {
		stream := oc.Responses.NewStreaming(ctx, responses.ResponseNewParams{Model: "m",
			Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("hi")}})
		var types []string
		var text strings.Builder
		var final responses.Response
		for stream.Next() {
			ev := stream.Current()
			if len(types) == 0 || types[len(types)-1] != ev.Type {
				types = append(types, ev.Type)
			}
			switch ev.Type {
			case "response.output_text.delta":
				Expect(ev.OutputIndex).To(BeZero())
				text.WriteString(ev.Delta)
			case "response.completed":
				final = ev.Response
			}
		}
		Expect(stream.Err()).NotTo(HaveOccurred())
		Expect(types).To(Equal([]string{"response.created", "response.in_progress", "response.output_item.added",
			"response.content_part.added", "response.output_text.delta", "response.output_text.done",
			"response.content_part.done", "response.output_item.done", "response.completed"}))
		Expect(final.OutputText()).To(Equal(text.String()), "response.completed carries the whole output")
		Expect(final.Usage.OutputTokens).To(Equal(int64(3)))
	})

	It("streams Anthropic messages that accumulate into the message", func() {
		stream := ac.Messages.NewStreaming(ctx, anthropic.MessageNewParams{Model: "c", MaxTokens: 10,
			Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("hi"))}})
		var msg anthropic.Message
		for stream.Next() {
			Expect(msg.Accumulate(stream.Current())).To(Succeed())
		}
		Expect(stream.Err()).NotTo(HaveOccurred())
		Expect(msg.Content).To(HaveLen(1))
		Expect(msg.Content[0].Text).To(Equal("word word word "))
		Expect(msg.Usage.OutputTokens).To(Equal(int64(3)))
	})
})
