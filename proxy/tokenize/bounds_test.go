// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package tokenize

import (
	"encoding/json"
	"flag"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/tokenwarden/tokenwarden/proxy/estimate"
)

var printTable = flag.Bool("corpus-table", false, "print the estimator's error against o200k_base as docs/estimation.md's table")

// chatBody is a chat request whose one user message is prompt.
func chatBody(t testing.TB, prompt string) []byte {
	t.Helper()
	b, err := json.Marshal(map[string]any{
		"model":    "gpt-4o",
		"messages": []map[string]string{{"role": "user", "content": prompt}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// ratios are one category's estimate / tokenizer ratios.
type ratios struct {
	generous, lower []float64
	// under and over count the prompts whose generous estimate is below the
	// tokenizer's input, and whose lower bound is above the tokenizer's text.
	under, over int
}

// measureCorpus measures the estimator against the named encoding on every prompt of
// the corpus, sent as a chat request's one user message.
func measureCorpus(t testing.TB, name string) map[string]*ratios {
	enc := Get(name)
	out := map[string]*ratios{}
	for _, s := range readCorpus(t) {
		body := chatBody(t, s.Prompt)
		est, err := estimate.Body(body)
		if err != nil || !est.Parsed {
			t.Fatalf("estimate of a %s prompt: %v, parsed %v", s.Category, err, est.Parsed)
		}
		res, ok := enc.Body(body)
		if !ok {
			t.Fatalf("tokenizer refused a %s prompt", s.Category)
		}
		r := out[s.Category]
		if r == nil {
			r = &ratios{}
			out[s.Category] = r
		}
		r.generous = append(r.generous, float64(est.Input)/float64(res.Input))
		r.lower = append(r.lower, float64(est.InputLower)/float64(res.Text))
		if est.Input < res.Input {
			r.under++
		}
		if est.InputLower > res.Text {
			r.over++
		}
	}
	return out
}

// TestEstimatorBounds holds the estimator to its promise on every prompt of the
// corpus, for both encodings: its generous estimate of a chat request is never below
// the input counted with the tokenizer (text, media and framing), and its lower bound
// never above the tokenizer's count of the text. -corpus-table prints the ratios as
// docs/estimation.md's tables.
func TestEstimatorBounds(t *testing.T) {
	for _, name := range Names {
		m := measureCorpus(t, name)
		for _, c := range categories {
			r := m[c]
			if len(r.generous) != perCategory {
				t.Fatalf("%s: %d prompts, want %d", c, len(r.generous), perCategory)
			}
			if r.under != 0 {
				t.Errorf("%s, %s: the generous estimate is below the tokenizer's count on %d of %d prompts (lowest ratio %.2f)", name, c, r.under, perCategory, slices.Min(r.generous))
			}
			if r.over != 0 {
				t.Errorf("%s, %s: the lower bound is above the tokenizer's count on %d of %d prompts (highest ratio %.2f)", name, c, r.over, perCategory, slices.Max(r.lower))
			}
		}
		if *printTable {
			fmt.Printf("%s:\n\n%s\n", name, corpusTable(m))
		}
	}
}

func corpusTable(m map[string]*ratios) string {
	var b strings.Builder
	b.WriteString("| category | generous / tokenizer: min | median | max | below the tokenizer | lower bound / tokenizer: min | median | max | above the tokenizer |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|\n")
	for _, c := range categories {
		r := m[c]
		g, l := slices.Sorted(slices.Values(r.generous)), slices.Sorted(slices.Values(r.lower))
		fmt.Fprintf(&b, "| %s | %.2f | %.2f | %.2f | %d of %d | %.2f | %.2f | %.2f | %d of %d |\n", c,
			g[0], g[len(g)/2], g[len(g)-1], r.under, len(g), l[0], l[len(l)/2], l[len(l)-1], r.over, len(l))
	}
	return b.String()
}
