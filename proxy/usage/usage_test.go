// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package usage_test

import (
	"testing"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/tokenwarden/tokenwarden/proxy/usage"
)

func TestUsage(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "Usage Suite")
}

var _ = Describe("FromJSON", func() {
	DescribeTable("reads each family's usage",
		func(body string, want usage.Usage) { Expect(usage.FromJSON([]byte(body))).To(Equal(want)) },
		Entry("OpenAI chat", `{"choices":[],"usage":{"prompt_tokens":12,"completion_tokens":30,"total_tokens":42}}`,
			usage.Usage{Input: 12, Output: 30, Found: true}),
		Entry("Responses", `{"output":[],"usage":{"input_tokens":7,"output_tokens":9,"total_tokens":16}}`,
			usage.Usage{Input: 7, Output: 9, Found: true}),
		Entry("Anthropic with cache tokens", `{"content":[],"usage":{"input_tokens":5,"cache_creation_input_tokens":100,"cache_read_input_tokens":1000,"output_tokens":8}}`,
			usage.Usage{Input: 1105, Output: 8, Found: true}),
		Entry("no usage", `{"choices":[]}`, usage.Usage{}),
		Entry("null usage", `{"usage":null}`, usage.Usage{}),
		Entry("not JSON", `<html>`, usage.Usage{}),
	)
})

// feed writes a stream in pieces of n bytes, so events split across writes.
func feed(s *usage.Stream, stream string, n int) {
	for len(stream) > 0 {
		k := min(n, len(stream))
		_, _ = s.Write([]byte(stream[:k]))
		stream = stream[k:]
	}
}

const (
	openAIStream = "data: {\"choices\":[{\"delta\":{\"content\":\"Hello\"}}]}\n\n" +
		"data: {\"choices\":[{\"delta\":{\"content\":\" world\"}}]}\n\n" +
		"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":11,\"completion_tokens\":2}}\n\n" +
		"data: [DONE]\n\n"
	responsesStream = "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"usage\":null}}\n\n" +
		"event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"Hi\"}\n\n" +
		"event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"usage\":{\"input_tokens\":4,\"output_tokens\":1}}}\n\n"
	anthropicStream = "event: message_start\r\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":25,\"cache_read_input_tokens\":5,\"output_tokens\":1}}}\r\n\r\n" +
		"event: content_block_delta\r\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hello!\"}}\r\n\r\n" +
		"event: message_delta\r\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":15}}\r\n\r\n" +
		"event: message_stop\r\ndata: {\"type\":\"message_stop\"}\r\n\r\n"
)

var _ = Describe("Stream", func() {
	DescribeTable("reads the usage of each family's stream, however it is split",
		func(stream string, want usage.Usage) {
			for _, n := range []int{1, 7, 64, len(stream)} {
				s := &usage.Stream{}
				feed(s, stream, n)
				Expect(s.Ended()).To(BeTrue(), "split %d", n)
				Expect(s.Usage()).To(Equal(want), "split %d", n)
				Expect(s.Final(999)).To(Equal(want))
			}
		},
		Entry("OpenAI chat with include_usage", openAIStream, usage.Usage{Input: 11, Output: 2, Found: true}),
		Entry("Responses' response.completed", responsesStream, usage.Usage{Input: 4, Output: 1, Found: true}),
		Entry("Anthropic message_start plus message_delta, with CRLF lines", anthropicStream, usage.Usage{Input: 30, Output: 15, Found: true}),
	)

	It("settles a stream without usage on the input estimate plus the counted deltas", func() {
		s := &usage.Stream{}
		feed(s, "data: {\"choices\":[{\"delta\":{\"content\":\"Hello\"}}]}\n\ndata: {\"choices\":[{\"delta\":{\"content\":\"日本\"}}]}\n\ndata: [DONE]\n\n", 5)
		Expect(s.Ended()).To(BeTrue())
		Expect(s.Final(40)).To(Equal(usage.Usage{Input: 40, Output: 2 + 2, Found: true}))
	})

	It("has not ended before its end marker, or after an error event", func() {
		s := &usage.Stream{}
		feed(s, openAIStream[:len(openAIStream)-len("data: [DONE]\n\n")], 3)
		Expect(s.Ended()).To(BeFalse())
		s = &usage.Stream{}
		feed(s, "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\"}}\n\ndata: {\"type\":\"message_stop\"}\n\n", 100)
		Expect(s.Ended()).To(BeFalse())
	})

	It("passes a line longer than its bound without keeping it", func() {
		s := &usage.Stream{}
		long := "data: {\"x\":\"" + string(make([]byte, 2<<20)) + "\"}\n\n"
		feed(s, long+openAIStream, 4096)
		Expect(s.Usage()).To(Equal(usage.Usage{Input: 11, Output: 2, Found: true}))
	})
})
