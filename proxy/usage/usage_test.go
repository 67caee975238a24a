// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package usage_test

import (
	"math"
	"runtime"
	"strings"
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
			usage.Usage{Input: 1105, Output: 8, Cached: 1000, Found: true}),
		Entry("OpenAI chat with cached prompt tokens", `{"usage":{"prompt_tokens":2006,"completion_tokens":300,"prompt_tokens_details":{"cached_tokens":1920,"audio_tokens":0}}}`,
			usage.Usage{Input: 2006, Output: 300, Cached: 1920, Found: true}),
		Entry("Responses with cached input tokens", `{"usage":{"input_tokens":84,"input_tokens_details":{"cached_tokens":64},"output_tokens":9,"output_tokens_details":{"reasoning_tokens":0}}}`,
			usage.Usage{Input: 84, Output: 9, Cached: 64, Found: true}),
		Entry("a cached count larger than the input is the input", `{"usage":{"prompt_tokens":10,"prompt_tokens_details":{"cached_tokens":50}}}`,
			usage.Usage{Input: 10, Cached: 10, Found: true}),
		Entry("cached_tokens outside the details object counts nothing", `{"usage":{"prompt_tokens":10,"cached_tokens":5,"completion_tokens_details":{"cached_tokens":4}}}`,
			usage.Usage{Input: 10, Found: true}),
		Entry("Responses, usage before the output", `{"usage":{"input_tokens":7,"output_tokens":9},"output":[{"content":[{"text":"hi"}]}]}`,
			usage.Usage{Input: 7, Output: 9, Found: true}),
		Entry("a key spelled with escapes, as encoding/json reads it", `{"u\u0073age":{"prompt_tokens":3,"completion_tokens":4}}`,
			usage.Usage{Input: 3, Output: 4, Found: true}),
		Entry("counts as floats, huge or negative: rounded up, saturated, never below zero",
			`{"usage":{"prompt_tokens":2.5,"completion_tokens":-4,"cache_read_input_tokens":1e300}}`,
			usage.Usage{Input: 3 + math.MaxInt64/4, Output: 0, Cached: math.MaxInt64 / 4, Found: true}),
		Entry("a usage object nested elsewhere is not the response's", `{"choices":[{"usage":{"prompt_tokens":5}}]}`, usage.Usage{}),
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
		Entry("Anthropic message_start plus message_delta, with CRLF lines", anthropicStream, usage.Usage{Input: 30, Output: 15, Cached: 5, Found: true}),
		Entry("OpenAI chat with cached prompt tokens in the usage chunk",
			"data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":1500,\"completion_tokens\":2,\"prompt_tokens_details\":{\"cached_tokens\":1024}}}\n\ndata: [DONE]\n\n",
			usage.Usage{Input: 1500, Output: 2, Cached: 1024, Found: true}),
		Entry("Responses' response.completed with cached input tokens",
			"data: {\"type\":\"response.completed\",\"response\":{\"usage\":{\"input_tokens\":90,\"input_tokens_details\":{\"cached_tokens\":80},\"output_tokens\":3}}}\n\n",
			usage.Usage{Input: 90, Output: 3, Cached: 80, Found: true}),
	)

	It("settles a stream without usage on the input estimate plus the counted deltas", func() {
		s := &usage.Stream{}
		feed(s, "data: {\"choices\":[{\"delta\":{\"content\":\"Hello\"}}]}\n\ndata: {\"choices\":[{\"delta\":{\"content\":\"日本\"}}]}\n\ndata: [DONE]\n\n", 5)
		Expect(s.Ended()).To(BeTrue())
		Expect(s.Final(40)).To(Equal(usage.Usage{Input: 40, Output: 2 + 3, Found: true}))
	})

	It("has not ended before its end marker, or after an error event", func() {
		s := &usage.Stream{}
		feed(s, openAIStream[:len(openAIStream)-len("data: [DONE]\n\n")], 3)
		Expect(s.Ended()).To(BeFalse())
		s = &usage.Stream{}
		feed(s, "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\"}}\n\ndata: {\"type\":\"message_stop\"}\n\n", 100)
		Expect(s.Ended()).To(BeFalse())
	})

	It("reads the usage of an event line of any size, without keeping it", func() {
		s := &usage.Stream{}
		feed(s, "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"Hi\"}\n\n", 7)
		// response.completed echoes the whole response: 64 MiB of output before its usage.
		feed(s, `event: response.completed`+"\n"+`data: {"type":"response.completed","response":{"output":[{"content":[{"text":"`, 7)
		chunk := []byte(strings.Repeat("abcdefgh", 4096))
		allocated := allocatedBytes(func() {
			for i := 0; i < 64<<20/len(chunk); i++ {
				_, _ = s.Write(chunk)
			}
		})
		Expect(allocated).To(BeNumerically("<", 1<<20), "memory does not grow with the 64 MiB line")
		feed(s, `"}]}],"usage":{"input_tokens":4,"output_tokens":16777216}}}`+"\n\n", 3)
		Expect(s.Ended()).To(BeTrue())
		Expect(s.Usage()).To(Equal(usage.Usage{Input: 4, Output: 16777216, Found: true}))
	})

	It("ignores a data line that is not one JSON value", func() {
		s := &usage.Stream{}
		feed(s, "data: {\"usage\":{\"prompt_tokens\":5}} x\n\ndata: {\"x\":\""+string(make([]byte, 2<<20))+"\"}\n\n"+openAIStream, 4096)
		Expect(s.Usage()).To(Equal(usage.Usage{Input: 11, Output: 2, Found: true}))
	})

	DescribeTable("settles a stream",
		func(stream string, end usage.End, want usage.Usage, verdict usage.Verdict) {
			for _, n := range []int{1, 7, len(stream) + 1} {
				s := &usage.Stream{}
				feed(s, stream, n)
				u, v := s.Settlement(40, end)
				Expect(v).To(Equal(verdict), "split %d", n)
				Expect(u).To(Equal(want), "split %d", n)
			}
		},
		Entry("that ended, on its usage", openAIStream, usage.Complete, usage.Usage{Input: 11, Output: 2, Found: true}, usage.Settle),
		Entry("that ended without usage, on the input estimate plus the deltas",
			"data: {\"choices\":[{\"delta\":{\"content\":\"Hello\"}}]}\n\ndata: [DONE]\n\n", usage.Complete,
			usage.Usage{Input: 40, Output: 2, Found: true}, usage.Settle),
		Entry("cut after deltas, on the input estimate plus the deltas it carried", upTo(openAIStream, "data: {\"choices\":[],"),
			usage.Cut, usage.Usage{Input: 40, Output: 2 + 2, Found: true}, usage.Settle),
		Entry("cut after its usage and before [DONE], on its usage", upTo(openAIStream, "data: [DONE]"),
			usage.Cut, usage.Usage{Input: 11, Output: 2, Found: true}, usage.Settle),
		Entry("cut before any delta: released", "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\n\n",
			usage.Cut, usage.Usage{}, usage.Release),
		Entry("of Anthropic cut after deltas, on message_start's input plus the deltas", upTo(anthropicStream, "event: message_delta"),
			usage.Cut, usage.Usage{Input: 30, Output: 2, Cached: 5, Found: true}, usage.Settle),
		Entry("of Anthropic cut after message_start, before any delta: released", upTo(anthropicStream, "event: content_block_delta"),
			usage.Cut, usage.Usage{}, usage.Release),
		Entry("that reported an error after deltas, on what it carried",
			"data: {\"type\":\"content_block_delta\",\"delta\":{\"type\":\"text_delta\",\"text\":\"abcdefgh\"}}\n\ndata: {\"type\":\"error\",\"error\":{}}\n\n",
			usage.Complete, usage.Usage{Input: 40, Output: 2, Found: true}, usage.Settle),
		Entry("that reported an error before any delta: released", "data: {\"type\":\"error\",\"error\":{}}\n\n",
			usage.Complete, usage.Usage{}, usage.Release),
		Entry("that could not be decoded before any delta: at its reservation", "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\n\n",
			usage.Unreadable, usage.Usage{}, usage.Reserve),
		Entry("of Responses, counting reasoning summaries but not audio",
			"data: {\"type\":\"response.reasoning_summary_text.delta\",\"delta\":\"abcd\"}\n\n"+
				"data: {\"delta\":\""+strings.Repeat("QUFB", 100)+"\",\"type\":\"response.audio.delta\"}\n\n",
			usage.Cut, usage.Usage{Input: 40, Output: 1, Found: true}, usage.Settle),
	)
})

// body feeds a body in pieces of n bytes.
func body(doc string, n int) *usage.Body {
	b := &usage.Body{}
	for len(doc) > 0 {
		k := min(n, len(doc))
		_, _ = b.Write([]byte(doc[:k]))
		doc = doc[k:]
	}
	return b
}

var _ = Describe("Body", func() {
	DescribeTable("settles a response body",
		func(doc string, end usage.End, want usage.Usage, verdict usage.Verdict) {
			for _, n := range []int{1, 5, 4096} {
				u, v := body(doc, n).Settlement(40, end)
				Expect(v).To(Equal(verdict), "split %d", n)
				Expect(u).To(Equal(want), "split %d", n)
			}
		},
		Entry("on the usage it reports", `{"choices":[{"message":{"content":"Hello"}}],"usage":{"prompt_tokens":12,"completion_tokens":30}}`,
			usage.Complete, usage.Usage{Input: 12, Output: 30, Found: true}, usage.Settle),
		Entry("without usage, on the input estimate plus the chat text it carries",
			`{"choices":[{"message":{"content":"Hello world","reasoning_content":"hmm","tool_calls":[{"function":{"arguments":"{\"q\":1}"}}]}}]}`,
			usage.Complete, usage.Usage{Input: 40, Output: 8}, usage.Settle),
		Entry("without usage, counting a completion's text", `{"choices":[{"text":"abcdefgh"}]}`,
			usage.Complete, usage.Usage{Input: 40, Output: 2}, usage.Settle),
		Entry("without usage, counting Anthropic's text, thinking and tool input",
			`{"content":[{"type":"text","text":"abcd"},{"type":"thinking","thinking":"efgh"},{"type":"tool_use","id":"x","input":{"city":"Paris"}}]}`,
			usage.Complete, usage.Usage{Input: 40, Output: 5}, usage.Settle),
		Entry("without usage, counting the Responses output",
			`{"output":[{"type":"message","content":[{"type":"output_text","text":"abcd"}]},{"type":"function_call","arguments":"efgh"},{"type":"reasoning","summary":[{"text":"ijkl"}]}]}`,
			usage.Complete, usage.Usage{Input: 40, Output: 3}, usage.Settle),
		Entry("without usage or text, on the input estimate", `{"choices":[]}`,
			usage.Complete, usage.Usage{Input: 40}, usage.Settle),
		Entry("cut after its usage, on the usage", `{"usage":{"input_tokens":3,"output_tokens":4},"content":[{"text":"ab`,
			usage.Cut, usage.Usage{Input: 3, Output: 4, Found: true}, usage.Settle),
		Entry("cut in its text, on the input estimate plus the text seen", `{"choices":[{"message":{"content":"abcdefgh`,
			usage.Cut, usage.Usage{Input: 40, Output: 2}, usage.Settle),
		Entry("cut before any text: released", `{"id":"chatcmpl-1","choices":[{"message":{"role":"assistant"`,
			usage.Cut, usage.Usage{}, usage.Release),
		Entry("that is not JSON: at its reservation", `<html>oops</html>`,
			usage.Complete, usage.Usage{}, usage.Reserve),
		Entry("that ends early though the upstream said it was whole: at its reservation", `{"choices":[{"message":{"content":"ab`,
			usage.Complete, usage.Usage{}, usage.Reserve),
		Entry("that could not be decoded: at its reservation", `{"choices":[{"message":{"content":"ab`,
			usage.Unreadable, usage.Usage{}, usage.Reserve),
		Entry("that is empty: released", ``, usage.Complete, usage.Usage{}, usage.Release),
	)

	It("reads the usage after 64 MiB of text, without keeping the body", func() {
		b := &usage.Body{}
		_, _ = b.Write([]byte(`{"choices":[{"message":{"content":"`))
		chunk := []byte(strings.Repeat("abcdefgh", 4096))
		allocated := allocatedBytes(func() {
			for i := 0; i < 64<<20/len(chunk); i++ {
				_, _ = b.Write(chunk)
			}
		})
		Expect(allocated).To(BeNumerically("<", 1<<20), "memory does not grow with the 64 MiB body")
		_, _ = b.Write([]byte(`"}}],"usage":{"prompt_tokens":11,"completion_tokens":16777216}}`))
		u, v := b.Settlement(40, usage.Complete)
		Expect(v).To(Equal(usage.Settle))
		Expect(u).To(Equal(usage.Usage{Input: 11, Output: 16777216, Found: true}))
	})

	It("counts 64 MiB of text without usage within one token per chunk", func() {
		b := &usage.Body{}
		_, _ = b.Write([]byte(`{"choices":[{"message":{"content":"`))
		chunk := []byte(strings.Repeat("abcdefgh", 4096))
		for i := 0; i < 64<<20/len(chunk); i++ {
			_, _ = b.Write(chunk)
		}
		_, _ = b.Write([]byte(`"}}]}`))
		u, v := b.Settlement(40, usage.Complete)
		Expect(v).To(Equal(usage.Settle))
		Expect(u.Output).To(BeNumerically(">=", 64<<20/4))
		Expect(u.Output).To(BeNumerically("<=", 64<<20/4+64<<20/512))
	})
})

// allocatedBytes is what fn allocated on the heap (the whole process's allocations
// while it ran, so a stray one elsewhere cannot fail a bound of a mebibyte).
func allocatedBytes(fn func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	fn()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// upTo is s up to the first marker, which must be in it.
func upTo(s, marker string) string {
	i := strings.Index(s, marker)
	if i < 0 {
		panic("no " + marker + " in the stream")
	}
	return s[:i]
}
