// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package estimate_test

import (
	"encoding/json"
	"strings"
	"testing"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/tokenwarden/tokenwarden/proxy/estimate"
)

func TestEstimate(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "Estimate Suite")
}

// texts is what the estimate charges for these strings, each counted on its own.
func texts(ss ...string) int64 {
	var n int64
	for _, s := range ss {
		n += estimate.Text(s)
	}
	return n
}

// body estimates a body that must parse.
func body(s string) estimate.Estimate {
	GinkgoHelper()
	e, err := estimate.Body([]byte(s))
	Expect(err).NotTo(HaveOccurred())
	return e
}

var _ = Describe("Text", func() {
	DescribeTable("counts a quarter token per ASCII letter, more for digits, punctuation and emoji",
		func(s string, want int64) { Expect(estimate.Text(s)).To(Equal(want)) },
		Entry("empty", "", int64(0)),
		Entry("one byte rounds up", "a", int64(1)),
		Entry("four letters", "abcd", int64(1)),
		Entry("five letters", "abcde", int64(2)),
		Entry("every word is a token at least", "a b c d e", int64(5)),
		Entry("punctuation is a third", `{"":[]}`, int64(3)),
		// o200k_base: "1", " ", "2", ... is 9 tokens; each run of digits costs two
		// tokens beyond its digits.
		Entry("a digit alone is its own token, and so is the space before it", "1 2 3 4 5", int64(13)),
		Entry("long numbers are groups of three digits", "123456789012", int64(6)),
		Entry("CJK characters are a token and a quarter each", "日本語", int64(4)),
		Entry("mixed", "hi 日本", int64(4)),
		Entry("a character of four bytes is three tokens", "🦜🔥", int64(6)),
		Entry("bytes that are not UTF-8 are a token each", "\x80\x80\x80\x80", int64(4)),
	)
})

var _ = Describe("Ceiling", func() {
	DescribeTable("reads every spelling of a stated limit as the same ceiling",
		func(raw string, want int64) { Expect(estimate.Ceiling(json.RawMessage(raw))).To(Equal(want)) },
		Entry("an integer", `32000`, int64(32000)),
		Entry("a float", `32000.0`, int64(32000)),
		Entry("a fractional float rounds up", `100.2`, int64(101)),
		Entry("a numeric string", `"32000"`, int64(32000)),
		Entry("an exponent", `3.2e4`, int64(32000)),
		Entry("a number too large for an int64 saturates", `1e30`, estimate.MaxTokens),
		Entry("a number too large for a float64 saturates", `1e400`, estimate.MaxTokens),
		Entry("a negative number is no limit", `-5`, int64(0)),
		Entry("a word is no limit", `"lots"`, int64(0)),
		Entry("null is no limit", `null`, int64(0)),
		Entry("absent is no limit", ``, int64(0)),
	)
})

var _ = Describe("Body", func() {
	It("walks every message with its floor and reserves the largest stated ceiling", func() {
		e := body(`{"model":"gpt-4o","max_tokens":100,"max_completion_tokens":"300","max_output_tokens":200.0,
			"messages":[{"role":"system","content":"be brief"},{"role":"user","content":[{"type":"text","text":"hello there"}]}]}`)
		Expect(e.Parsed).To(BeTrue())
		Expect(e.Model).To(Equal("gpt-4o"))
		// Every key and string counts as text, every number one token, every message 4.
		keys := texts("model", "max_tokens", "max_completion_tokens", "max_output_tokens", "messages",
			"role", "content", "role", "content", "type", "text")
		values := texts("gpt-4o", "300", "system", "be brief", "user", "text", "hello there") + 2
		Expect(e.Input).To(Equal(keys + values + 2*estimate.MessageFloor))
		Expect(e.Output).To(Equal(int64(300)))
		Expect(e.Total()).To(Equal(e.Input + 300))
	})

	It("defaults the output ceiling to 4096", func() {
		Expect(body(`{"messages":[]}`).Output).To(Equal(int64(4096)))
	})

	It("charges tools, functions and response formats by their whole JSON", func() {
		tools := `[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object"}}}]`
		e := body(`{"tools":` + tools + `,"functions":[{"name":"f"}],"response_format":{"type":"json_object"}}`)
		Expect(e.Input).To(Equal(texts("tools", tools, "functions", `[{"name":"f"}]`, "response_format", `{"type":"json_object"}`)))
	})

	It("adds the prompt fields of completions, Responses and Anthropic", func() {
		Expect(body(`{"prompt":"abcdefgh"}`).Input).To(Equal(int64(2 + 2)))
		Expect(body(`{"prompt":[1,2,3,4,5]}`).Input).To(Equal(int64(2+5)), "token ids are one token each")
		Expect(body(`{"input":"abcdefgh","instructions":"abcd"}`).Input).To(Equal(int64(2 + 2 + 3 + 1)))
		Expect(body(`{"input":[{"role":"user","content":"abcd"}]}`).Input).To(Equal(int64(2 + 4 + 1 + 1 + 2 + 1)))
		Expect(body(`{"system":[{"type":"text","text":"abcdefgh"}],"messages":[]}`).Input).To(Equal(int64(2 + 1 + 1 + 1 + 2 + 2)))
	})

	It("charges a body that is not JSON a conservative reservation", func() {
		b := `{"messages":[{"role":"user","content":"hi"}],"temperature":NaN}`
		e := body(b)
		Expect(e.Parsed).To(BeFalse())
		Expect(e.Input).To(Equal(int64((len(b) + 2) / 3)))
		Expect(e.Output).To(Equal(int64(4096)))
	})
})

var _ = Describe("Media", func() {
	b64 := func(n int) string { return strings.Repeat("QUJD", n/4) } // n base64 characters, 3n/4 bytes
	part := func(p string) string {
		return `{"messages":[{"role":"user","content":[` + p + `]}]}`
	}
	// frame is what a message holding one part costs around the part: floor, keys and role.
	frame := body(part(`{}`)).Input

	DescribeTable("prices a real media payload by its class and size, and everything else as text",
		func(p string, want func() int64) {
			Expect(body(part(p)).Input - frame).To(Equal(want()))
		},
		Entry("an OpenAI image_url data URL: MediaTokens plus a byte per 4,096 decoded",
			`{"type":"image_url","image_url":{"url":"data:image/png;base64,`+b64(400000)+`"}}`,
			func() int64 {
				return texts("type", "image_url", "image_url", "url") + estimate.MediaCost("image/png", 300000)
			}),
		Entry("an Anthropic image source, its media type after the data",
			`{"type":"image","source":{"data":"`+b64(400000)+`","type":"base64","media_type":"image/jpeg"}}`,
			func() int64 {
				return texts("type", "image", "source", "data", "type", "base64", "media_type", "image/jpeg") + estimate.MediaCost("image/jpeg", 300000)
			}),
		Entry("an Anthropic PDF document: its cost grows with its size",
			`{"type":"document","source":{"type":"base64","media_type":"application/pdf","data":"`+b64(400000)+`"}}`,
			func() int64 {
				return texts("type", "document", "source", "type", "base64", "media_type", "application/pdf", "data") + estimate.MediaCost("application/pdf", 300000)
			}),
		Entry("OpenAI input_audio: its format marks the payload as audio",
			`{"type":"input_audio","input_audio":{"data":"`+b64(40000)+`","format":"wav"}}`,
			func() int64 {
				return texts("type", "input_audio", "input_audio", "data", "format", "wav") + estimate.MediaCost("audio/wav", 30000)
			}),
		Entry("a data URL sent as the text of a message is text",
			`{"type":"text","text":"data:image/png;base64,`+b64(4000)+`"}`,
			func() int64 { return texts("type", "text", "text", "data:image/png;base64,"+b64(4000)) }),
		Entry("base64 under data in a text part, with nothing saying it is media, is text",
			`{"type":"text","text":"hi","data":"`+b64(4000)+`"}`,
			func() int64 { return texts("type", "text", "text", "hi", "data", b64(4000)) }),
		Entry("a text/plain document source is text",
			`{"type":"document","source":{"type":"text","media_type":"text/plain","data":"`+b64(4000)+`"}}`,
			func() int64 {
				return texts("type", "document", "source", "type", "text", "media_type", "text/plain", "data", b64(4000))
			}),
		Entry("a duplicated type: the last one says the source is not base64, so it is text",
			`{"type":"document","source":{"type":"base64","type":"text","data":"`+b64(4000)+`"}}`,
			func() int64 {
				return texts("type", "document", "source", "type", "base64", "type", "text", "data", b64(4000))
			}),
		Entry("a data URL that is not base64 is text",
			`{"type":"image_url","image_url":{"url":"data:image/png,`+strings.Repeat("x", 4000)+`"}}`,
			func() int64 {
				return texts("type", "image_url", "image_url", "url", "data:image/png,"+strings.Repeat("x", 4000))
			}),
	)
})

var _ = Describe("Hostile bodies", func() {
	DescribeTable("are read exactly as the upstream decodes them",
		func(b string, check func(estimate.Estimate)) { check(body(b)) },
		Entry(`an escaped "messages" key still counts the prompt`,
			`{"m\u0065ssages":[{"role":"user","content":"`+strings.Repeat("a", 4000)+`"}]}`,
			func(e estimate.Estimate) { Expect(e.Input).To(BeNumerically(">=", 1000)) }),
		Entry(`an escaped "max_tokens" key is the ceiling`,
			`{"max_\u0074okens":100000}`,
			func(e estimate.Estimate) { Expect(e.Output).To(Equal(int64(100000))) }),
		Entry(`an escaped "model" key names the model`,
			`{"mod\u0065l":"gpt-4o"}`,
			func(e estimate.Estimate) { Expect(e.Model).To(Equal("gpt-4o")) }),
		Entry(`a key in another case is another key`,
			`{"Model":"gpt-4o","MAX_TOKENS":100000}`,
			func(e estimate.Estimate) {
				Expect(e.Model).To(BeEmpty())
				Expect(e.Output).To(Equal(int64(estimate.DefaultOutput)))
			}),
		Entry(`duplicated keys: the last one wins, as upstreams read it`,
			`{"max_tokens":1e30,"max_tokens":4000,"n":5,"n":1,"model":"a","model":"b"}`,
			func(e estimate.Estimate) {
				Expect(e.Output).To(Equal(int64(4000)))
				Expect(e.Model).To(Equal("b"))
			}),
		Entry(`a duplicated messages key counts the one the upstream reads`,
			`{"messages":[{"content":"`+strings.Repeat("a", 40)+`"}],"messages":[{"content":"`+strings.Repeat("b", 4000)+`"}]}`,
			func(e estimate.Estimate) { Expect(e.Input).To(BeNumerically(">=", 1000)) }),
		Entry(`a ceiling times n that overflows an int64 saturates instead of wrapping`,
			`{"max_tokens":4611686018427387904,"n":1e300}`,
			func(e estimate.Estimate) {
				Expect(e.Output).To(Equal(estimate.MaxTokens))
				Expect(e.Total()).To(Equal(estimate.MaxTokens))
			}),
		Entry(`a number too large for a float64 saturates`,
			`{"max_tokens":1e400}`,
			func(e estimate.Estimate) {
				Expect(e.Parsed).To(BeTrue())
				Expect(e.Output).To(Equal(estimate.MaxTokens))
			}),
		Entry(`object keys count as text`,
			`{"messages":[{"`+strings.Repeat("k", 40000)+`":1}]}`,
			func(e estimate.Estimate) { Expect(e.Input).To(BeNumerically(">=", 10000)) }),
		Entry(`a prompt array of three prompts reserves three ceilings`,
			`{"prompt":["a","b","c"],"max_tokens":100}`,
			func(e estimate.Estimate) { Expect(e.Output).To(Equal(int64(300))) }),
		Entry(`a prompt of token ids is one prompt; a list of them is one prompt each`,
			`{"prompt":[[1,2],[3,4]],"max_tokens":100}`,
			func(e estimate.Estimate) { Expect(e.Output).To(Equal(int64(200))) }),
		Entry(`best_of multiplies the ceiling when larger than n`,
			`{"prompt":"a","max_tokens":100,"n":2,"best_of":5}`,
			func(e estimate.Estimate) { Expect(e.Output).To(Equal(int64(500))) }),
		Entry(`n is not capped: a hundred thousand choices reserve a hundred thousand ceilings`,
			`{"max_tokens":100,"n":100000}`,
			func(e estimate.Estimate) { Expect(e.Output).To(Equal(int64(10000000))) }),
		Entry(`bytes that are not UTF-8 each count, as each decodes to U+FFFD`,
			"{\"messages\":[{\"content\":\""+strings.Repeat("\x80", 4000)+"\"}]}",
			func(e estimate.Estimate) { Expect(e.Input).To(BeNumerically(">=", 4000)) }),
	)

	It("refuses a body nested deeper than MaxDepth without recursion, however deep", func() {
		deep := `{"messages":` + strings.Repeat("[", 4<<20)
		_, err := estimate.Body([]byte(deep))
		Expect(err).To(MatchError(estimate.ErrTooDeep))
		_, err = estimate.Body([]byte(`{"a":` + strings.Repeat(`{"a":`, estimate.MaxDepth) + `1` + strings.Repeat(`}`, estimate.MaxDepth+1)))
		Expect(err).To(MatchError(estimate.ErrTooDeep))
		e, err := estimate.Body([]byte(`{"a":` + strings.Repeat(`[`, estimate.MaxDepth-1) + strings.Repeat(`]`, estimate.MaxDepth-1) + `}`))
		Expect(err).NotTo(HaveOccurred())
		Expect(e.Parsed).To(BeTrue(), "exactly MaxDepth levels are read")
	})
})

var _ = Describe("the one-pass scanner", func() {
	It("reads escapes and refuses what encoding/json refuses", func() {
		e := body(`{"model":"gpt-\u0034o","max_tokens":10,"messages":[{"content":"a\"b"}]}`)
		Expect(e.Parsed).To(BeTrue())
		Expect(e.Model).To(Equal("gpt-4o"))
		Expect(body(`{"max_tokens":10} x`).Parsed).To(BeFalse())
		Expect(body(`{"max_tokens":01}`).Parsed).To(BeFalse())
		Expect(body(`{"messages":[1,]}`).Parsed).To(BeFalse())
	})
})
