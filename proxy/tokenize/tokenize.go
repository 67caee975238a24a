// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

// Package tokenize counts a request's input with a real tokenizer, for the models of
// the registry that name one (models[].tokenizer): an OpenAI byte-pair encoding whose
// vocabulary is compiled into the binary, loaded once, on the first configuration
// that names it. The count replaces the estimator's input (the budget reservation)
// and its lower bound (the context-window pre-check); what a tokenizer cannot see,
// media payloads and each message's framing, keeps the estimator's allowance.
// docs/estimation.md gives the rules, the cost and the estimator's error against it.
package tokenize

import (
	"hash/maphash"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/tiktoken-go/tokenizer/codec"

	"github.com/tokenwarden/tokenwarden/proxy/estimate"
)

// The encodings a model may name.
const (
	// O200kBase is the encoding of GPT-4o, GPT-4.1, GPT-5 and the o-series.
	O200kBase = "o200k_base"
	// Cl100kBase is the encoding of GPT-4 and GPT-3.5.
	Cl100kBase = "cl100k_base"
)

// Names are the encodings a model may name.
var Names = []string{O200kBase, Cl100kBase}

// Encoding is one byte-pair encoding. It is safe for concurrent use.
type Encoding struct {
	name   string
	once   sync.Once
	loaded atomic.Bool
	codec  *codec.Codec
	cache  countCache
}

var encodings = map[string]*Encoding{
	O200kBase:  {name: O200kBase},
	Cl100kBase: {name: Cl100kBase},
}

// Get returns the named encoding, building it on its first call (its vocabulary
// takes some tens of milliseconds and tens of MiB to load); nil for a name that is
// not one of Names.
func Get(name string) *Encoding {
	e := encodings[name]
	if e == nil {
		return nil
	}
	e.once.Do(e.load)
	return e
}

func (e *Encoding) load() {
	switch e.name {
	case O200kBase:
		e.codec = codec.NewO200kBase()
	case Cl100kBase:
		e.codec = codec.NewCl100kBase()
	}
	e.loaded.Store(true)
}

// Loaded reports whether the named encoding has been built: a proxy builds one only
// when a configuration names it.
func Loaded(name string) bool {
	e := encodings[name]
	return e != nil && e.loaded.Load()
}

// Name is the encoding's name.
func (e *Encoding) Name() string { return e.name }

// Count is the number of tokens of s. A string that is not valid UTF-8 is counted as
// its bytes are (every byte is a token of a byte-level encoding). The count of a string
// of CacheMinBytes or more is remembered (cache.go).
func (e *Encoding) Count(s string) int64 {
	if len(s) < CacheMinBytes {
		return e.count(s)
	}
	h := maphash.String(cacheSeed, s)
	if n, ok := e.cache.get(h, len(s)); ok {
		return n
	}
	n := e.count(s)
	e.cache.put(h, len(s), n)
	return n
}

// count tokenizes s.
func (e *Encoding) count(s string) int64 {
	n, err := e.codec.Count(s)
	if err != nil {
		// The codec fails only when its split expression times out, and none is set:
		// the estimate then stands in.
		return estimate.Text(s)
	}
	// The library's vocabularies lack the byte 0x7F (DEL), which it drops; OpenAI's
	// encodings have it as a token of its own.
	return int64(n + strings.Count(s, "\x7f"))
}

// Result is a request body's count.
type Result struct {
	// Text is the tokenizer's count of the request's text: every string value (keys
	// are the JSON's structure, not text the model reads), one token per number, and
	// tools, functions, response_format and text as the whole JSON text they are
	// written with, as the estimator counts them. The context-window pre-check reads it.
	Text int64
	// Input is Text plus what a tokenizer cannot see, at the estimator's allowances:
	// each media payload at estimate.MediaCost, and estimate.MessageFloor per message
	// of messages and per item of an input array. Budgets reserve it.
	Input int64
}

// The top-level fields sent to the model as the JSON text they are written with.
var jsonTextFields = map[string]bool{"tools": true, "functions": true, "response_format": true, "text": true}

// Body counts a request body. ok is false when the body is not a JSON object (the
// estimate then stands: the caller keeps it). The request path counts the estimate's
// view instead (View): the body is read once.
func (e *Encoding) Body(body []byte) (r Result, ok bool) {
	est, err := estimate.BodyView(body)
	if err != nil || est.View() == nil {
		return Result{}, false
	}
	return e.View(est.View()), true
}

// View counts a request body from the estimate's view of it, as encoding/json would
// decode it: each object's members by their decoded keys, the last duplicate winning.
func (e *Encoding) View(v *estimate.View) (r Result) {
	c := counter{enc: e, v: v, body: string(v.Body())}
	var floors, media int64
	for _, m := range c.members(0, nil) {
		if jsonTextFields[m.key] {
			r.Text += e.Count(c.body[v.Span(m.value).Start:v.Span(m.value).End])
			continue
		}
		if v.Kind(m.value) == estimate.KindArray && (m.key == "messages" || m.key == "input") {
			floors += c.elems(m.value) * estimate.MessageFloor
		}
		text, md := c.walk(m.value)
		r.Text += text
		media += md
	}
	r.Input = r.Text + floors + media
	return r
}

// counter walks a view; body is the view's body as a string, which the strings
// without escapes are slices of. scratch holds the members of the object being walked.
type counter struct {
	enc     *Encoding
	v       *estimate.View
	body    string
	scratch []member
}

// member is one member of an object: its decoded key and its value's index.
type member struct {
	key   string
	value int
}

// str is string or key i as encoding/json decodes it.
func (c *counter) str(i int) string {
	if s, decoded := c.v.String(i); decoded {
		return s
	}
	sp := c.v.Span(i)
	return c.body[sp.Start+1 : sp.End-1]
}

// elems is the number of elements of array i.
func (c *counter) elems(i int) (n int64) {
	for j := i + 1; j < c.v.Next(i); j = c.v.Next(j) {
		n++
	}
	return n
}

// members are object i's members as encoding/json decodes them into a map, appended
// to ms[:0]: the last occurrence of a key wins (in the place of the first, which does
// not matter to a sum).
func (c *counter) members(i int, ms []member) []member {
	ms = ms[:0]
	var index map[string]int // past a few members
	for j := i + 1; j < c.v.Next(i); {
		m := member{key: c.str(j), value: j + 1}
		j = c.v.Next(j + 1)
		at := -1
		switch {
		case index != nil:
			if k, ok := index[m.key]; ok {
				at = k
			}
		default:
			for k := range ms {
				if ms[k].key == m.key {
					at = k
					break
				}
			}
		}
		if at >= 0 {
			ms[at] = m
			continue
		}
		ms = append(ms, m)
		if len(ms) > 16 && index == nil {
			index = make(map[string]int, 2*len(ms))
			for k, m := range ms {
				index[m.key] = k
			}
		} else if index != nil {
			index[m.key] = len(ms) - 1
		}
	}
	return ms
}

// walk counts value i's text and media, with an explicit stack (the estimator has
// already refused a body nested deeper than estimate.MaxDepth).
func (c *counter) walk(i int) (text, media int64) {
	stack := []int{i}
	for len(stack) > 0 {
		i := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		switch c.v.Kind(i) {
		case estimate.KindString:
			text += c.enc.Count(c.str(i))
		case estimate.KindNumber:
			text++
		case estimate.KindArray:
			for j := i + 1; j < c.v.Next(i); j = c.v.Next(j) {
				stack = append(stack, j)
			}
		case estimate.KindObject:
			ms := c.members(i, c.scratch)
			c.scratch = ms // walked before the next object's members
			hint := c.mediaHint(ms)
			for _, m := range ms {
				if c.v.Kind(m.value) == estimate.KindString {
					if cost, isMedia := mediaCost(m.key, c.str(m.value), hint); isMedia {
						media += cost
						continue
					}
				}
				stack = append(stack, m.value)
			}
		}
	}
	return text, media
}

// mediaHint reads an object's media type as the estimator does: a media_type,
// mime_type or mimeType that is not text/*, else a format (audio), else "type":
// "base64" (a document unless said otherwise).
func (c *counter) mediaHint(ms []member) hint {
	str := func(key string) (string, bool) {
		for _, m := range ms {
			if m.key == key && c.v.Kind(m.value) == estimate.KindString {
				return c.str(m.value), true
			}
		}
		return "", false
	}
	for _, k := range [...]string{"media_type", "mime_type", "mimeType"} {
		if mt, ok := str(k); ok {
			return hint{media: !isText(mt), mediaType: mt}
		}
	}
	if _, ok := str("format"); ok {
		return hint{media: true, mediaType: "audio/"}
	}
	if t, _ := str("type"); t == "base64" {
		return hint{media: true}
	}
	return hint{}
}

// hint is what an object says about its bare base64 payloads: their media type, or
// none (they are text).
type hint struct {
	media     bool
	mediaType string
}

// mediaCost reports whether the string s under key k of an object is a media
// payload, and its cost at the estimator's price.
func mediaCost(k, s string, h hint) (int64, bool) {
	switch k {
	case "url", "image_url", "file_data":
		if mt, n, ok := dataURL(s); ok {
			if isText(mt) {
				return 0, false
			}
			return estimate.MediaCost(mt, n), true
		}
	}
	switch k {
	case "data", "file_data":
		if n, ok := base64Len(s); ok && h.media {
			return estimate.MediaCost(h.mediaType, n), true
		}
	}
	return 0, false
}

func isText(mediaType string) bool {
	return strings.HasPrefix(strings.ToLower(strings.TrimSpace(mediaType)), "text/")
}

// dataURL reads data:[TYPE][;PARAM...];base64,PAYLOAD: TYPE and the payload's
// decoded size.
func dataURL(s string) (string, int64, bool) {
	if len(s) < 5 || !strings.EqualFold(s[:5], "data:") {
		return "", 0, false
	}
	header, payload, ok := strings.Cut(s[5:], ",")
	if !ok || len(header) < 7 || !strings.EqualFold(header[len(header)-7:], ";base64") {
		return "", 0, false
	}
	n, ok := base64Len(payload)
	if !ok {
		return "", 0, false
	}
	mt, _, _ := strings.Cut(header[:len(header)-7], ";")
	return mt, n, true
}

// base64Len reports whether s is base64 (standard or URL alphabet, with padding) and
// its decoded size.
func base64Len(s string) (int64, bool) {
	if s == "" {
		return 0, false
	}
	var chars int64
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c >= 'A' && c <= 'Z', c >= 'a' && c <= 'z', c >= '0' && c <= '9', c == '+', c == '/', c == '-', c == '_':
			chars++
		case c == '=':
		default:
			return 0, false
		}
	}
	return chars * 3 / 4, true
}
