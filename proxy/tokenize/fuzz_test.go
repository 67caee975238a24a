// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package tokenize

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/tokenwarden/tokenwarden/proxy/estimate"
)

// FuzzCount: any string, valid UTF-8 or not, is counted without a panic, at no more
// tokens than it has bytes (a byte-level encoding's token holds at least one) and at
// least one when it is not empty. Its seeds run with every go test.
func FuzzCount(f *testing.F) {
	for _, s := range []string{
		"", "hello world", "\xff\xfe\xfd", "a\xc3", "\xed\xa0\x80", "日本語\x80テキスト",
		strings.Repeat(" ", 5000) + "x", strings.Repeat("\n\r", 300), strings.Repeat("9", 1000),
		strings.Repeat("a", 3000), strings.Repeat("!?", 2000), "<|endoftext|>", "<|endofprompt|>",
		"👨‍👩‍👧🏳️‍🌈🇫🇷", strings.Repeat("\u0301", 500), "I'LL've 'S 's'T",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		for _, name := range Names {
			n := Get(name).Count(s)
			if n > int64(len(s)) || (len(s) > 0 && n < 1) {
				t.Fatalf("%s: %d tokens for %d bytes (valid UTF-8: %v)", name, n, len(s), utf8.ValidString(s))
			}
		}
	})
}

// FuzzBody: any body is counted or left to the estimate without a panic, and a
// counted one's input is never below its text.
func FuzzBody(f *testing.F) {
	for _, s := range []string{
		`{"messages":[{"role":"user","content":"hi"}]}`,
		`{"messages":[{"role":"user","content":"\ud800\udfff\u0000\xff"}],"max_tokens":1e400}`,
		`{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"}}]}]}`,
		`{"messages":[{"content":[{"source":{"type":"base64","data":"QUJD","media_type":"text/plain"}}]}]}`,
		`{"tools":[{"type":"function"}],"tools":"\xff"}`,
		`{"input":[[[[[[[[[[[["deep"]]]]]]]]]]]]}`,
		"{\"prompt\":\"\xc3\x28\xa0\xa1\"}",
		`{"messages":[{"content":"` + strings.Repeat(" ", 4000) + `"}]}`,
		`[1,2,3]`, `{`, `null`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		r, ok := Get(O200kBase).Body(body)
		if ok && (r.Text < 0 || r.Input < r.Text) {
			t.Fatalf("text %d, input %d", r.Text, r.Input)
		}
	})
}

// FuzzLowerBound: the estimator's lower bound of a chat request whose one message is
// any string never exceeds the tokenizer's count of its text, for either encoding: the
// context-window pre-check reads the lower bound, and refusing a request that fits is
// a bug. Its seeds, the kinds of text that a token packs most densely, run with every
// go test.
func FuzzLowerBound(f *testing.F) {
	for _, s := range []string{
		"", "hello world", "The quick brown fox. It's a dog's life, isn't it?", "a b c d e f g",
		"helloWorld HTTPServer __init__ x1y2z3 a.b.c", "don't 'll 's't 're've", "abcdefghijklmnopqrstuvwxyz",
		".translatesAutoresizingMaskIntoConstraints verantwoordelijkheid",
		"1 2 3 4 5", "123456789012", "3.14159, -2e10", "1²3 ١٢٣ ①②③", "0x7fffffff",
		strings.Repeat(" ", 5000) + "x", strings.Repeat("\n\r\t ", 300), strings.Repeat("-", 500),
		strings.Repeat("=", 200) + strings.Repeat("/", 200), "\u3000\u3000\u3000\u3000\u3000\u3000\u3000\u3000\u3000",
		" 微信公众号天天中彩票", "ありがとうございます", "습니다 가나다라마바사", " สำนักเลขานุการองค์กร",
		" государственного пользователя", " მნიშვნელოვანია", "————————————————", "café naïve a\u0301b",
		"👨‍👩‍👧🏳️‍🌈🇫🇷👍🏽", "𠀀𠀁𠀂", "\xff\xfe\xfd", "a\xc3b", "\xed\xa0\x80x", "<|endoftext|>x<|endofprompt|>",
		"\x7f\x7f\x00\x01", `{"a":[1,2,{"b":"c"}]}`, "\\n\\t\\u00e9",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		body := chatBody(t, s)
		e, err := estimate.Body(body)
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range Names {
			r, ok := Get(name).Body(body)
			if !ok {
				t.Fatalf("%s did not count %q", name, body)
			}
			if e.InputLower > r.Text {
				t.Fatalf("%s: lower bound %d above the count %d of %q", name, e.InputLower, r.Text, s)
			}
		}
	})
}
