// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package usage_test

import (
	"testing"

	"github.com/tokenwarden/tokenwarden/proxy/usage"
)

var ends = []usage.End{usage.Complete, usage.Cut, usage.Unreadable}

// FuzzStream checks that the SSE usage parser never fails on any input and reads the
// same usage, and settles the same way, however the bytes are split across writes.
func FuzzStream(f *testing.F) {
	for _, s := range []string{openAIStream, responsesStream, anthropicStream, "data: [DONE]\n", "data: {\"usage\":{\"prompt_tokens\":-1}}\n\n",
		"data: {\"usage\":{\"prompt_tokens\":9,\"prompt_tokens_details\":{\"cached_tokens\":4}}}\n\n", "data:\n\ndata",
		"data: {\"type\":\"response.output_text.delta\",\"delta\":\"a\\ud83d\\ude00\\u00e9\"}\n", "data: {\"choices\":[{\"delta\":{\"content\":[{\"text\":\"x\"}]}}]}\n"} {
		f.Add([]byte(s), uint8(3))
	}
	f.Fuzz(func(t *testing.T, stream []byte, split uint8) {
		whole := &usage.Stream{}
		_, _ = whole.Write(stream)
		pieces := &usage.Stream{}
		n := int(split%64) + 1
		for i := 0; i < len(stream); i += n {
			_, _ = pieces.Write(stream[i:min(i+n, len(stream))])
		}
		if whole.Usage() != pieces.Usage() || whole.Ended() != pieces.Ended() || whole.Final(7) != pieces.Final(7) {
			t.Fatalf("split %d changed the reading: %+v/%v vs %+v/%v", n, whole.Usage(), whole.Ended(), pieces.Usage(), pieces.Ended())
		}
		for _, end := range ends {
			wu, wv := whole.Settlement(7, end)
			pu, pv := pieces.Settlement(7, end)
			if wu != pu || wv != pv {
				t.Fatalf("split %d changed the settlement: %+v/%v vs %+v/%v", n, wu, wv, pu, pv)
			}
			if wu.Input < 0 || wu.Output < 0 || wu.Cached < 0 || wu.Cached > wu.Input {
				t.Fatalf("negative usage %+v", wu)
			}
		}
	})
}

// FuzzBody checks the same of the JSON body reader.
func FuzzBody(f *testing.F) {
	for _, s := range []string{`{"choices":[{"message":{"content":"Hello"}}],"usage":{"prompt_tokens":12,"completion_tokens":30}}`,
		`{"content":[{"type":"tool_use","input":{"a":["b",{"c":"d"}]}}],"usage":{"input_tokens":1,"cache_read_input_tokens":2}}`,
		`{"output":[{"content":[{"text":"\u00e9\ud800x"}]}]}`, `{"usage":{"input_tokens":8,"input_tokens_details":{"cached_tokens":3}}}`, `[1,2,{"usage":3}]`, `-0.5e+3`, `{"a":tru}`, ``} {
		f.Add([]byte(s), uint8(3))
	}
	f.Fuzz(func(t *testing.T, doc []byte, split uint8) {
		whole := &usage.Body{}
		_, _ = whole.Write(doc)
		pieces := &usage.Body{}
		n := int(split%64) + 1
		for i := 0; i < len(doc); i += n {
			_, _ = pieces.Write(doc[i:min(i+n, len(doc))])
		}
		if whole.Usage() != pieces.Usage() {
			t.Fatalf("split %d changed the usage: %+v vs %+v", n, whole.Usage(), pieces.Usage())
		}
		for _, end := range ends {
			wu, wv := whole.Settlement(7, end)
			pu, pv := pieces.Settlement(7, end)
			if wu != pu || wv != pv {
				t.Fatalf("split %d changed the settlement: %+v/%v vs %+v/%v", n, wu, wv, pu, pv)
			}
			if wu.Cached < 0 || wu.Cached > wu.Input {
				t.Fatalf("cached count %d outside 0..input %d", wu.Cached, wu.Input)
			}
		}
	})
}
