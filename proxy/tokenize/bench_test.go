// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package tokenize

import (
	"encoding/json"
	"math/rand/v2"
	"strings"
	"testing"
	"unicode/utf8"
)

// benchText is size bytes of the corpus generator's kind of text, cut at a character.
func benchText(kind string, size int) string {
	r := rand.New(rand.NewPCG(1, 2))
	gen := map[string]func(*rand.Rand) string{"english": genEnglish, "code": genCode, "cjk": genCJK}[kind]
	var b strings.Builder
	for b.Len() < size {
		b.WriteString(gen(r))
		b.WriteString("\n")
	}
	s := b.String()[:size]
	for !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s
}

var benchSizes = []struct {
	name string
	size int
}{{"1KB", 1 << 10}, {"4KB", 4 << 10}, {"64KB", 64 << 10}}

// BenchmarkCount is o200k_base's cost per byte of prompt text it has not counted
// before (the cache is bypassed).
func BenchmarkCount(b *testing.B) {
	enc := Get(O200kBase)
	for _, kind := range []string{"english", "code", "cjk"} {
		for _, sz := range benchSizes {
			s := benchText(kind, sz.size)
			b.Run(kind+"/"+sz.name, func(b *testing.B) {
				b.SetBytes(int64(len(s)))
				b.ReportAllocs()
				for b.Loop() {
					enc.count(s)
				}
			})
		}
	}
}

// BenchmarkBody is a whole chat body's count: decoding it and counting its text,
// new (the cache emptied before each count) and again (the same body counted before,
// as a conversation's history is).
func BenchmarkBody(b *testing.B) {
	enc := Get(O200kBase)
	for _, kind := range []string{"english", "code", "cjk"} {
		for _, sz := range benchSizes {
			body, _ := json.Marshal(map[string]any{"model": "gpt-4o", "max_tokens": 256,
				"messages": []map[string]string{{"role": "user", "content": benchText(kind, sz.size)}}})
			b.Run(kind+"/"+sz.name+"/new", func(b *testing.B) {
				b.SetBytes(int64(len(body)))
				b.ReportAllocs()
				for b.Loop() {
					enc.cache = countCache{}
					enc.Body(body)
				}
			})
			b.Run(kind+"/"+sz.name+"/again", func(b *testing.B) {
				b.SetBytes(int64(len(body)))
				b.ReportAllocs()
				for b.Loop() {
					enc.Body(body)
				}
			})
		}
	}
}

// BenchmarkHostile is what the worst kinds of text cost: long runs that are one
// piece of the split expression, merged byte pair by byte pair.
func BenchmarkHostile(b *testing.B) {
	enc := Get(O200kBase)
	for name, s := range map[string]string{
		"spaces":      strings.Repeat(" ", 64<<10),
		"letters":     strings.Repeat("a", 64<<10),
		"punctuation": strings.Repeat("!?", 32<<10),
		"digits":      strings.Repeat("7", 64<<10),
		"invalidUTF8": strings.Repeat("\xff\xfe", 32<<10),
		"marks":       strings.Repeat("\u0301", 32<<10),
	} {
		b.Run(name, func(b *testing.B) {
			b.SetBytes(int64(len(s)))
			for b.Loop() {
				enc.count(s)
			}
		})
	}
}
