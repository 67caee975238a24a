// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package usage_test

import (
	"testing"

	"github.com/tokenwarden/tokenwarden/proxy/usage"
)

// FuzzStream checks that the SSE usage parser never fails on any input and reads the
// same usage however the bytes are split across writes.
func FuzzStream(f *testing.F) {
	for _, s := range []string{openAIStream, responsesStream, anthropicStream, "data: [DONE]\n", "data: {\"usage\":{\"prompt_tokens\":-1}}\n\n", "data:\n\ndata"} {
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
	})
}
