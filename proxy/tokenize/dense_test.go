// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package tokenize

import (
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/tokenwarden/tokenwarden/proxy/estimate"
)

// TestLowerBoundOnDenseText holds the lower bound against the densest text there is:
// strings of random tokens of each vocabulary, each a token that packs the most text
// an encoding can (long words, runs of punctuation and spaces, CJK phrases).
func TestLowerBoundOnDenseText(t *testing.T) {
	r := rand.New(rand.NewPCG(18, 42))
	for _, name := range Names {
		enc := Get(name)
		var vocab []string
		for id := uint(0); ; id++ {
			tok, err := enc.codec.Decode([]uint{id})
			if err != nil {
				if id < 100000 {
					continue
				}
				break
			}
			vocab = append(vocab, tok)
		}
		for range 500 {
			var b strings.Builder
			for n := 1 + r.IntN(40); n > 0; n-- {
				b.WriteString(vocab[r.IntN(len(vocab))])
			}
			s := b.String()
			body := chatBody(t, s)
			e, err := estimate.Body(body)
			if err != nil {
				t.Fatal(err)
			}
			if res, _ := enc.Body(body); e.InputLower > res.Text {
				t.Errorf("%s: lower bound %d above the count %d of %q", name, e.InputLower, res.Text, s)
			}
		}
	}
}
