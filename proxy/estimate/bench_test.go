// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package estimate_test

import (
	"bufio"
	"encoding/json"
	"os"
	"testing"

	"github.com/tokenwarden/tokenwarden/proxy/estimate"
)

var chatBody = []byte(`{"model":"gpt-4o","max_tokens":256,"messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"Summarise the plot of a long novel in three sentences, please."}]}`)

func BenchmarkBody(b *testing.B) {
	b.ReportAllocs()
	b.SetBytes(int64(len(chatBody)))
	for b.Loop() {
		if e, _ := estimate.Body(chatBody); e.Total() == 0 {
			b.Fatal("no estimate")
		}
	}
}

// BenchmarkBodyCorpus estimates, per category of proxy/tokenize's corpus, a chat
// request whose messages are that category's 50 prompts.
func BenchmarkBodyCorpus(b *testing.B) {
	f, err := os.Open("../tokenize/testdata/corpus.jsonl")
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	type message struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}
	var order []string
	byCategory := map[string][]message{}
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var s struct{ Category, Prompt string }
		if err := json.Unmarshal(sc.Bytes(), &s); err != nil {
			b.Fatal(err)
		}
		if byCategory[s.Category] == nil {
			order = append(order, s.Category)
		}
		byCategory[s.Category] = append(byCategory[s.Category], message{"user", s.Prompt})
	}
	for _, c := range order {
		body, err := json.Marshal(map[string]any{"model": "gpt-4o", "messages": byCategory[c]})
		if err != nil {
			b.Fatal(err)
		}
		b.Run(c, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				if e, _ := estimate.Body(body); e.Total() == 0 {
					b.Fatal("no estimate")
				}
			}
		})
	}
}
