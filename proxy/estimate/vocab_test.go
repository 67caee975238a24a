// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package estimate_test

import (
	"testing"

	"github.com/tiktoken-go/tokenizer/codec"

	"github.com/tokenwarden/tokenwarden/proxy/estimate"
)

// TestLowerWideHoldsOnVocabularies checks the facts of the vocabularies of o200k_base
// and cl100k_base that the lower bound stands on (text.go), token by token: the
// shares of a token its characters of other scripts count (by their first bytes) add
// up to at most one token, and a token with an ASCII digit is one to three ASCII
// digits and nothing else.
func TestLowerWideHoldsOnVocabularies(t *testing.T) {
	for _, c := range []*codec.Codec{codec.NewO200kBase(), codec.NewCl100kBase()} {
		tokens, worst := 0, int64(0)
		for id := uint(0); ; id++ {
			tok, err := c.Decode([]uint{id})
			if err != nil {
				if id < 100000 {
					continue // ids the vocabulary skips
				}
				break
			}
			tokens++
			var wide int64
			digits, others := 0, 0
			for i := 0; i < len(tok); i++ {
				switch b := tok[i]; {
				case b >= '0' && b <= '9':
					digits++
				default:
					others++
					wide += estimate.LowerWide[b]
				}
			}
			if wide > estimate.LowerUnit {
				t.Errorf("%s: token %d %q counts %d/%d of a token in the lower bound", c.GetName(), id, tok, wide, estimate.LowerUnit)
			}
			if digits > 0 && (digits > 3 || others > 0) {
				t.Errorf("%s: token %d %q holds %d digits and %d other bytes", c.GetName(), id, tok, digits, others)
			}
			worst = max(worst, wide)
		}
		if tokens < 100000 {
			t.Fatalf("%s: %d tokens read", c.GetName(), tokens)
		}
		t.Logf("%s: %d tokens, the fullest counts %d/%d", c.GetName(), tokens, worst, estimate.LowerUnit)
	}
}
