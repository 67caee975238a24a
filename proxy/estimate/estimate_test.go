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

var _ = Describe("Text", func() {
	DescribeTable("counts a quarter token per ASCII byte and a token per other character",
		func(s string, want int64) { Expect(estimate.Text(s)).To(Equal(want)) },
		Entry("empty", "", int64(0)),
		Entry("one byte rounds up", "a", int64(1)),
		Entry("four bytes", "abcd", int64(1)),
		Entry("five bytes", "abcde", int64(2)),
		Entry("CJK characters are a token each", "日本語", int64(3)),
		Entry("mixed", "hi 日本", int64(1+2)),
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
		Entry("a negative number is no limit", `-5`, int64(0)),
		Entry("a word is no limit", `"lots"`, int64(0)),
		Entry("null is no limit", `null`, int64(0)),
		Entry("absent is no limit", ``, int64(0)),
	)
})

var _ = Describe("Body", func() {
	It("walks every message with its floor and reserves the largest stated ceiling", func() {
		e := estimate.Body([]byte(`{"model":"gpt-4o","max_tokens":100,"max_completion_tokens":"300","max_output_tokens":200.0,
			"messages":[{"role":"system","content":"be brief"},{"role":"user","content":[{"type":"text","text":"hello there"}]}]}`))
		Expect(e.Parsed).To(BeTrue())
		Expect(e.Model).To(Equal("gpt-4o"))
		// system: 4 + "system"(2) + "be brief"(2); user: 4 + "user"(1) + "text"(1) + "hello there"(3)
		Expect(e.Input).To(Equal(int64(8 + 9)))
		Expect(e.Output).To(Equal(int64(300)))
		Expect(e.Total()).To(Equal(int64(317)))
	})

	It("defaults the output ceiling to 4096", func() {
		Expect(estimate.Body([]byte(`{"messages":[]}`)).Output).To(Equal(int64(4096)))
	})

	It("multiplies the ceiling by the number of choices", func() {
		Expect(estimate.Body([]byte(`{"max_tokens":100,"n":3}`)).Output).To(Equal(int64(300)))
	})

	It("charges tools, functions and response formats by their whole JSON", func() {
		tools := `[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object"}}}]`
		e := estimate.Body([]byte(`{"tools":` + tools + `,"functions":[{"name":"f"}],"response_format":{"type":"json_object"}}`))
		Expect(e.Input).To(Equal(estimate.Text(tools) + estimate.Text(`[{"name":"f"}]`) + estimate.Text(`{"type":"json_object"}`)))
	})

	It("adds the prompt fields of completions, Responses and Anthropic", func() {
		Expect(estimate.Body([]byte(`{"prompt":"abcdefgh"}`)).Input).To(Equal(int64(2)))
		Expect(estimate.Body([]byte(`{"prompt":[1,2,3,4,5]}`)).Input).To(Equal(int64(5)), "token ids are one token each")
		Expect(estimate.Body([]byte(`{"input":"abcdefgh","instructions":"abcd"}`)).Input).To(Equal(int64(3)))
		Expect(estimate.Body([]byte(`{"input":[{"role":"user","content":"abcd"}]}`)).Input).To(Equal(int64(4 + 1 + 1)))
		Expect(estimate.Body([]byte(`{"system":[{"type":"text","text":"abcdefgh"}],"messages":[]}`)).Input).To(Equal(int64(1 + 2)))
	})

	It("charges a fixed cost for binary payloads instead of their bytes", func() {
		img := "data:image/png;base64," + strings.Repeat("A", 100000)
		e := estimate.Body([]byte(`{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"` + img + `"}}]}]}`))
		Expect(e.Input).To(Equal(int64(4 + 1 + 3 + estimate.MediaTokens)))
		e = estimate.Body([]byte(`{"messages":[{"role":"user","content":[{"type":"image","source":{"type":"base64","media_type":"image/png","data":"` + strings.Repeat("A", 100000) + `"}}]}]}`))
		Expect(e.Input).To(BeNumerically("<", 2000))
	})

	It("charges a body that is not JSON a conservative reservation", func() {
		body := `{"messages":[{"role":"user","content":"hi"}],"temperature":NaN}`
		e := estimate.Body([]byte(body))
		Expect(e.Parsed).To(BeFalse())
		Expect(e.Input).To(Equal(int64((len(body) + 2) / 3)))
		Expect(e.Output).To(Equal(int64(4096)))
	})
})

var _ = Describe("the one-pass scanner", func() {
	It("reads escapes, takes the largest of duplicated ceilings, and refuses trailing bytes", func() {
		e := estimate.Body([]byte(`{"model":"gpt-\u0034o","max_tokens":10,"max_tokens":"20","messages":[{"content":"a\"b"}]}`))
		Expect(e.Parsed).To(BeTrue())
		Expect(e.Model).To(Equal("gpt-4o"))
		Expect(e.Output).To(Equal(int64(20)))
		Expect(estimate.Body([]byte(`{"max_tokens":10} x`)).Parsed).To(BeFalse())
		Expect(estimate.Body([]byte(`{"max_tokens":01}`)).Parsed).To(BeFalse())
		Expect(estimate.Body([]byte(`{"messages":[1,]}`)).Parsed).To(BeFalse())
	})
})

// FuzzBody checks the scanner against encoding/json: a body is read as JSON exactly
// when encoding/json accepts it as an object, so no body escapes the conservative
// estimate by a parser difference.
func FuzzBody(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":5}`,
		`{"prompt":[1,2,3],"n":2}`, `{"input":[{"type":"message"}]}`, `{}`, `[]`, `{"a":NaN}`,
		`{"a":"\ud800"}`, `{"a":1e5,"b":-0.5,"c":[true,false,null]}`, `{"a":"x"`, ` {"a":{}} `,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		e := estimate.Body(body)
		var obj map[string]json.RawMessage
		isObject := json.Unmarshal(body, &obj) == nil && obj != nil
		if e.Parsed != isObject {
			t.Fatalf("Parsed=%v but encoding/json object=%v for %q", e.Parsed, isObject, body)
		}
		if e.Input < 0 || e.Output <= 0 {
			t.Fatalf("estimate %+v for %q", e, body)
		}
	})
}
