// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package tokenize

import (
	"encoding/base64"
	"fmt"
	"hash/maphash"
	"slices"
	"strings"
	"testing"

	"github.com/tokenwarden/tokenwarden/proxy/config"
	"github.com/tokenwarden/tokenwarden/proxy/estimate"
)

func TestGet(t *testing.T) {
	if Get("p50k_base") != nil || Get("") != nil {
		t.Fatal("Get returned an encoding the proxy does not offer")
	}
	for _, name := range Names {
		e := Get(name)
		if e == nil || e.Name() != name || !Loaded(name) {
			t.Fatalf("Get(%q) = %v", name, e)
		}
		if e != Get(name) {
			t.Fatalf("Get(%q) built the encoding twice", name)
		}
	}
}

// The configuration accepts exactly the encodings this package builds (it lists them
// itself, so that the operator does not link the vocabularies).
func TestConfigNamesEveryEncoding(t *testing.T) {
	if !slices.Equal(config.Tokenizers, Names) {
		t.Fatalf("config.Tokenizers %v, tokenize.Names %v", config.Tokenizers, Names)
	}
}

func TestCount(t *testing.T) {
	// Counts as OpenAI's tiktoken gives them.
	for _, tc := range []struct {
		enc, s string
		want   int64
	}{
		{O200kBase, "hello world", 2},
		{Cl100kBase, "hello world", 2},
		{O200kBase, "", 0},
		{O200kBase, "1 2 3 4 5", 9}, // digits are split from the spaces before them
		{Cl100kBase, "1 2 3 4 5", 9},
		{O200kBase, "1234567", 3},
		{Cl100kBase, "1234567", 3},
		{O200kBase, "a\x7fb", 3}, // the library drops DEL; OpenAI's encodings count it
		{Cl100kBase, "\x7f", 1},
	} {
		if got := Get(tc.enc).Count(tc.s); got != tc.want {
			t.Errorf("%s: Count(%q) = %d, want %d", tc.enc, tc.s, got, tc.want)
		}
	}
	// The two encodings differ: o200k_base has a larger vocabulary for other scripts.
	s := strings.Repeat("これは日本語の文章です。", 20)
	if o, c := Get(O200kBase).Count(s), Get(Cl100kBase).Count(s); o >= c {
		t.Errorf("Japanese: o200k_base %d tokens, cl100k_base %d: want fewer with o200k_base", o, c)
	}
}

func TestBody(t *testing.T) {
	enc := Get(O200kBase)
	c := func(s string) int64 { return enc.Count(s) }
	png := base64.StdEncoding.EncodeToString(make([]byte, 40960))
	tools := `[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}]`
	for _, tc := range []struct {
		name       string
		body       string
		text, full int64
	}{
		{
			name: "chat: every string value, one per number, a floor per message",
			body: `{"model":"gpt-4o","max_tokens":100,"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"What is the capital of France?"}]}`,
			text: c("gpt-4o") + 1 + c("system") + c("Be brief.") + c("user") + c("What is the capital of France?"),
			full: 2 * estimate.MessageFloor,
		},
		{
			name: "tools are their JSON text",
			body: `{"messages":[{"role":"user","content":"hi"}],"tools":` + tools + `}`,
			text: c("user") + c("hi") + c(tools),
			full: estimate.MessageFloor,
		},
		{
			name: "an image data URL costs the estimator's media price, not its text",
			body: `{"messages":[{"role":"user","content":[{"type":"text","text":"describe"},{"type":"image_url","image_url":{"url":"data:image/png;base64,` + png + `"}}]}]}`,
			text: c("user") + c("text") + c("describe") + c("image_url"),
			full: estimate.MessageFloor + estimate.MediaCost("image/png", 40960),
		},
		{
			name: "an Anthropic base64 source, its hints after the payload",
			body: `{"system":"Be brief.","messages":[{"role":"user","content":[{"type":"image","source":{"data":"` + png + `","type":"base64","media_type":"image/jpeg"}}]}]}`,
			text: c("Be brief.") + c("user") + c("image") + c("base64") + c("image/jpeg"),
			full: estimate.MessageFloor + estimate.MediaCost("image/jpeg", 40960),
		},
		{
			name: "a text/plain data URL is text",
			body: `{"messages":[{"role":"user","content":[{"type":"file","file":{"file_data":"data:text/plain;base64,aGVsbG8="}}]}]}`,
			text: c("user") + c("file") + c("data:text/plain;base64,aGVsbG8="),
			full: estimate.MessageFloor,
		},
		{
			name: "base64 under data with nothing saying it is media is text",
			body: `{"input":[{"role":"user","content":"x","data":"aGVsbG8="}]}`,
			text: c("user") + c("x") + c("aGVsbG8="),
			full: estimate.MessageFloor,
		},
		{
			name: "the last duplicate key counts, as the upstream reads it",
			body: `{"messages":[{"role":"user","content":"` + strings.Repeat("long ", 500) + `"}],"messages":[{"role":"user","content":"short"}]}`,
			text: c("user") + c("short"),
			full: estimate.MessageFloor,
		},
		{
			name: "a Responses string input has no floor; a number too large for a float64 is one token",
			body: `{"input":"Tell me a story.","instructions":"Be kind.","max_output_tokens":1e400}`,
			text: c("Tell me a story.") + c("Be kind.") + 1,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, ok := enc.Body([]byte(tc.body))
			if !ok {
				t.Fatal("not counted")
			}
			if r.Text != tc.text || r.Input != tc.text+tc.full {
				t.Fatalf("text %d, input %d; want text %d, input %d", r.Text, r.Input, tc.text, tc.text+tc.full)
			}
		})
	}
}

func TestBodyNotAnObject(t *testing.T) {
	enc := Get(O200kBase)
	for _, body := range []string{``, `null`, `[]`, `"text"`, `{"messages":[}`, `{"a":1} x`, `{"a":NaN}`} {
		if r, ok := enc.Body([]byte(body)); ok {
			t.Errorf("%q counted as %+v: the estimate must stand", body, r)
		}
	}
}

// A tokenizer model's count is the tokenizer's count of the prompt, below the
// estimate on prose.
func TestBodyTracksTheTokenizer(t *testing.T) {
	prose := strings.Repeat("The quick brown fox jumps over the lazy dog. ", 200)
	body := []byte(fmt.Sprintf(`{"messages":[{"role":"user","content":%q}]}`, prose))
	r, _ := Get(O200kBase).Body(body)
	est, _ := estimate.Body(body)
	if want := Get(O200kBase).Count(prose); r.Text < want || r.Text > want+2 {
		t.Fatalf("text %d, the prose alone is %d tokens", r.Text, want)
	}
	if est.Input <= r.Input {
		t.Fatalf("estimate %d, tokenizer %d: want the estimate above on prose", est.Input, r.Input)
	}
}

// A long string's count is remembered: the second count is the cache's, and equals
// the tokenizer's.
func TestCountCache(t *testing.T) {
	enc := Get(O200kBase)
	long := strings.Repeat("A conversation sends its history again. ", 20)
	want := enc.count(long)
	if got := enc.Count(long); got != want {
		t.Fatalf("first count %d, want %d", got, want)
	}
	if n, ok := enc.cache.get(maphash.String(cacheSeed, long), len(long)); !ok || n != want {
		t.Fatalf("not remembered: %d, %v", n, ok)
	}
	if got := enc.Count(long); got != want {
		t.Fatalf("second count %d, want %d", got, want)
	}
	short := strings.Repeat("x", CacheMinBytes-1)
	enc.Count(short)
	if _, ok := enc.cache.get(maphash.String(cacheSeed, short), len(short)); ok {
		t.Fatal("a short string was remembered")
	}
}

func TestCountCacheBounds(t *testing.T) {
	var c countCache
	c.put(7, 300, 42)
	if _, ok := c.get(7, 301); ok {
		t.Fatal("a hash of another length matched")
	}
	for h := uint64(0); h < 3*cacheShardEntries*cacheShards; h++ {
		c.put(h, 300, 1)
	}
	for i := range c.shards {
		if n := len(c.shards[i].m); n > cacheShardEntries {
			t.Fatalf("shard %d holds %d counts, at most %d", i, n, cacheShardEntries)
		}
	}
}

// Requests count at once: the encoding and its cache are shared (go test -race).
func TestCountConcurrently(t *testing.T) {
	enc := Get(O200kBase)
	texts := []string{strings.Repeat("history ", 100), strings.Repeat("tools ", 100), "short"}
	want := make([]int64, len(texts))
	for i, s := range texts {
		want[i] = enc.count(s)
	}
	errs := make(chan error, 8)
	for g := range 8 {
		go func() {
			for k := range 50 {
				i := (g + k) % len(texts)
				if got := enc.Count(texts[i]); got != want[i] {
					errs <- fmt.Errorf("text %d: %d tokens, want %d", i, got, want[i])
					return
				}
			}
			errs <- nil
		}()
	}
	for range 8 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}
