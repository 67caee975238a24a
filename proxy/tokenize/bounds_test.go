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

// knownBreaks are, per category of the corpus, the prompts where the estimator's
// promise does not hold against o200k_base (docs/estimation.md, "The estimator
// against a tokenizer"): how many generous estimates fall below the tokenizer's input
// and how many lower bounds rise above its text. The generous estimate counts one
// token per four ASCII bytes and per other character, and the lower bound a third of
// that; o200k_base spends a token on every group of up to three digits and on the
// space before it, up to three on one emoji character and eight on a family joined
// by zero-width joiners, and one on a run of up to hundreds of spaces or newlines.
// TestEstimatorBounds fails when any count changes, so that the docs follow the
// estimator.
var knownBreaks = map[string]struct{ under, over int }{
	"code":       {under: 1},
	"json":       {under: 7},
	"cjk":        {under: 1},
	"numbers":    {under: 50},
	"whitespace": {over: 14},
	"emoji":      {under: 35},
}

func measureCorpus(t testing.TB) map[string]*ratios {
	enc := Get(O200kBase)
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

// TestEstimatorBounds holds the estimator to its promise on the corpus: its generous
// estimate of a chat request is never below the input counted with o200k_base (text,
// media and framing), and its lower bound never above the tokenizer's count of the
// text, except on the prompts knownBreaks counts.
func TestEstimatorBounds(t *testing.T) {
	m := measureCorpus(t)
	for _, c := range categories {
		r := m[c]
		if len(r.generous) != perCategory {
			t.Fatalf("%s: %d prompts, want %d", c, len(r.generous), perCategory)
		}
		known := knownBreaks[c]
		if r.under != known.under {
			t.Errorf("%s: the generous estimate is below the tokenizer's count on %d of %d prompts, docs/estimation.md says %d", c, r.under, perCategory, known.under)
		}
		if r.over != known.over {
			t.Errorf("%s: the lower bound is above the tokenizer's count on %d of %d prompts, docs/estimation.md says %d", c, r.over, perCategory, known.over)
		}
	}
	if *printTable {
		fmt.Println(corpusTable(m))
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
