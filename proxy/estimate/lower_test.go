// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package estimate_test

import (
	"encoding/base64"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/tokenwarden/tokenwarden/proxy/estimate"
)

var _ = Describe("The lower bound and the output cap", func() {
	// The lower bound is a count of tokens the text cannot do without under
	// o200k_base and cl100k_base (text.go); proxy/tokenize checks it against both.
	It("counts each word of prose a token: the encodings never merge two words", func() {
		prose := strings.Repeat("The quick brown fox jumps over the lazy dog. ", 1000) // 9,000 words
		e := body(`{"model":"m","messages":[{"role":"user","content":"` + prose + `"}],"max_tokens":100}`)
		Expect(e.Input).To(BeNumerically(">=", 45000/4))
		Expect(e.InputLower).To(Equal(int64(9000 + 1))) // and "user"
		Expect(e.InputLower).To(BeNumerically("<", e.Input))
		Expect(e.OutputCap).To(Equal(int64(100)))
	})

	It("counts a CJK ideograph a tenth of a token: a token holds up to ten", func() {
		e := body(`{"messages":[{"role":"user","content":"` + strings.Repeat("漢", 3000) + `"}]}`)
		Expect(e.InputLower).To(Equal(int64(300 + 1)))
	})

	It("counts digits in threes, and runs of spaces, newlines or dashes not at all", func() {
		e := body(`{"messages":[{"role":"user","content":"` + strings.Repeat(" ", 4000) + strings.Repeat(`\n`, 500) +
			strings.Repeat("-", 300) + "1234567" + `"}]}`)
		Expect(e.InputLower).To(Equal(int64(3 + 1)))
		Expect(e.Input).To(BeNumerically(">", 1000))
	})

	It("leaves keys, and fields that are not the prompt, out", func() {
		e := body(`{"model":"gpt-4o","user":"someone","metadata":{"a":"b c d"},"messages":[{"role":"user","content":"hi"}]}`)
		Expect(e.InputLower).To(Equal(int64(2)))
	})

	It("leaves media and message framing out: an image is not text", func() {
		img := base64.StdEncoding.EncodeToString(make([]byte, 300000))
		e := body(`{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,` + img + `"}}]}]}`)
		Expect(e.Input).To(BeNumerically(">=", 1600))
		Expect(e.InputLower).To(BeNumerically("<", 20))
	})

	DescribeTable("reads the stated output cap of one completion, 0 when none is stated",
		func(b string, want int64) { Expect(body(b).OutputCap).To(Equal(want)) },
		Entry("max_tokens", `{"max_tokens":512,"n":3}`, int64(512)),
		Entry("max_completion_tokens", `{"max_completion_tokens":"64"}`, int64(64)),
		Entry("max_output_tokens (Responses)", `{"max_output_tokens":2000.0}`, int64(2000)),
		Entry("none", `{"messages":[]}`, int64(0)),
	)
})

var _ = Describe("A string longer than the counting block", func() {
	It("counts every byte of a megabyte string", func() {
		s := strings.Repeat("1a ", 400000) // 1.2 MB: each "1a " is 34/12 of a token, a digit and a word
		Expect(estimate.Text(s)).To(Equal(int64((400000*34 + 11) / 12)))
		e := body(`{"messages":[{"role":"user","content":"` + s + `"}]}`)
		Expect(e.InputLower).To(Equal(int64((400000+2)/3 + 400000 + 1)))
	})
})
