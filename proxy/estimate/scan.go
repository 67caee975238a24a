// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package estimate

import (
	"encoding/json"
	"errors"
	"unicode/utf8"
)

// The estimate walks the request body once, in place, without building values: a
// small JSON scanner that counts the text of every string it passes. It accepts
// exactly what encoding/json accepts (with one difference: numbers too large for a
// float64 are accepted and saturate, as Python's json does), and it never recurses: a
// value's nesting lives on an explicit stack bounded by MaxDepth, so no body can
// exhaust the goroutine stack. Anything that is not strict JSON stops it, and the
// caller falls back to the conservative estimate, so a body the scanner cannot read is
// never cheaper than one it can.

// MaxDepth is the deepest nesting of arrays and objects a body may have (the
// top-level object is depth 1). Python's json, which most inference servers use,
// gives up near 1,000 levels; encoding/json at 10,000.
const MaxDepth = 1000

var (
	errSyntax = errors.New("estimate: not JSON")
	// ErrTooDeep is returned for a body nested deeper than MaxDepth.
	ErrTooDeep = errors.New("the request body is nested deeper than 1000 levels")
)

type scanner struct {
	b []byte
	i int
	// view, when asked for, gets every value the scan passes (view.go).
	view *View
}

// frame is one open array or object during a walk.
type frame struct {
	obj bool
	// key is the object key whose value is being read, classified for media.
	key keyKind
	// media accumulates the base64 payloads found directly in this object, priced when
	// the object closes and its media type (a sibling key, in any order) is known.
	media pendingMedia
	// node is the container's index in the view, when there is one.
	node int32
}

// walked is what walking one value found.
type walked struct {
	// tokens is the text of every string and key, one per number, and the media cost.
	tokens int64
	// elems is the number of direct elements when the value is an array.
	elems int64
	// prompts is the number of direct elements that are strings or arrays (a prompt
	// array of several prompts; an array of token ids is one prompt).
	prompts int64
	// media is the part of tokens that is media cost, not text.
	media int64
	// lower is the lower bound of the text of every string (keys are structure, not
	// text) and number, media payloads not counted.
	lower int64
}

func (s *scanner) ws() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

func (s *scanner) peek() byte {
	s.ws()
	if s.i < len(s.b) {
		return s.b[s.i]
	}
	return 0
}

func (s *scanner) expect(c byte) error {
	if s.peek() != c {
		return errSyntax
	}
	s.i++
	return nil
}

// str scans a string and returns its raw contents (escapes left in place).
func (s *scanner) str() ([]byte, error) {
	raw, _, _, err := s.strText()
	return raw, err
}

// strText scans a string and returns its raw contents (escapes left in place), its
// generous count and its lower bound (text.go), counted in the same pass.
func (s *scanner) strText() (raw []byte, gen, lower int64, err error) {
	if s.peek() != '"' {
		return nil, 0, 0, errSyntax
	}
	s.i++
	start := s.i
	var units, digits, words, wide int64
	var acc uint64 // the packed count of the current block (text.go)
	pc := uint(catBreak)
	b, i := s.b, s.i
	blockEnd := min(len(b), i+blockBytes)
	for {
		if i >= blockEnd {
			if i >= len(b) {
				return nil, 0, 0, errSyntax
			}
			unpack(acc, &units, &digits, &words)
			acc, blockEnd = 0, min(len(b), i+blockBytes)
		}
		c := b[i]
		if e := pairTable[(pc+uint(c))&pairMask]; e&special == 0 {
			acc += e
			pc = nextCat[c]
			i++
			continue
		}
		switch {
		case c == '\\':
			if i+1 >= len(b) {
				return nil, 0, 0, errSyntax
			}
			if simpleEscape[b[i+1]] {
				// A run of them (newlines, tabs) at once.
				run := i
				i += 2
				for i+1 < len(b) && b[i] == '\\' && simpleEscape[b[i+1]] {
					i += 2
				}
				units += int64(i-run) * genASCII[cPunct]
				pc = catBreak
				continue
			}
			switch b[i+1] {
			case 'u':
				if i+6 > len(b) || !isHex4(b[i+2:i+6]) {
					return nil, 0, 0, errSyntax
				}
				i += 6
				units += 6 * genASCII[cPunct]
				// It may decode to a letter or an apostrophe: no word starts after it.
				pc = catWord
			default:
				return nil, 0, 0, errSyntax
			}
		case c == '"':
			s.i = i + 1
			unpack(acc, &units, &digits, &words)
			gen, lower := totals(units, digits, words, wide)
			return b[start:i], gen, lower, nil
		case c < utf8.RuneSelf:
			return nil, 0, 0, errSyntax // a control
		default:
			// A character of another script; a byte that is not valid UTF-8 too.
			// A run of them at once; the usual three-byte characters (CJK) decoded in
			// place.
			for {
				if c >= 0xE1 && c != 0xED && i+2 < len(b) && b[i+1]&0xC0 == 0x80 && b[i+2]&0xC0 == 0x80 && c <= 0xEF {
					units += genWide[3]
					wide += lowerWide[c]
					i += 3
				} else {
					r, size := utf8.DecodeRune(b[i:])
					if r == utf8.RuneError && size == 1 {
						units += genInvalid
					} else {
						units += genWide[size&7]
						wide += lowerWide[c]
					}
					i += size
				}
				if i >= len(b) || b[i] < utf8.RuneSelf {
					break
				}
				c = b[i]
			}
			pc = catWord
		}
	}
}

// simpleEscape marks the characters after a backslash that make a two-byte escape.
var simpleEscape = [256]bool{'"': true, '\\': true, '/': true, 'b': true, 'f': true, 'n': true, 'r': true, 't': true}

func isHex4(b []byte) bool {
	for _, c := range b {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') && (c < 'A' || c > 'F') {
			return false
		}
	}
	return true
}

// literal scans true, false, null or a number and returns its bytes.
func (s *scanner) literal() ([]byte, error) {
	s.ws()
	start := s.i
	for s.i < len(s.b) {
		c := s.b[s.i]
		if (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '+' || c == '.' || c == 'E' {
			s.i++
			continue
		}
		break
	}
	lit := s.b[start:s.i]
	switch string(lit) {
	case "true", "false", "null":
		return lit, nil
	}
	if !validNumber(lit) {
		return nil, errSyntax
	}
	return lit, nil
}

// validNumber is JSON's number grammar: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
func validNumber(b []byte) bool {
	i := 0
	if i < len(b) && b[i] == '-' {
		i++
	}
	digits := func() int {
		n := 0
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
			n++
		}
		return n
	}
	if i < len(b) && b[i] == '0' {
		i++
	} else if digits() == 0 {
		return false
	}
	if i < len(b) && b[i] == '.' {
		i++
		if digits() == 0 {
			return false
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if digits() == 0 {
			return false
		}
	}
	return i == len(b)
}

// walk consumes one value and counts it (see walked). depth is the nesting of the
// container the value sits in; key is the object key it sits under. It keeps the
// value's nesting on a stack of its own and fails with ErrTooDeep past MaxDepth.
func (s *scanner) walk(depth int, key keyKind) (walked, error) {
	var w walked
	// The usual shallow bodies fit buf and allocate nothing.
	var buf [8]frame
	stack := buf[:0]
	for {
		// At a value: a scalar is counted; a container is opened.
		var kind byte // the value just completed: '"', '[', '{' or 0 for a literal
		switch c := s.peek(); c {
		case '{', '[':
			if depth+len(stack) >= MaxDepth {
				return w, ErrTooDeep
			}
			f := frame{obj: c == '{'}
			if s.view != nil {
				f.node = s.view.add(containerKind(c), s.i, s.i)
			}
			s.i++
			stack = append(stack, f)
			top := &stack[len(stack)-1]
			if c == '{' {
				if s.peek() == '}' {
					s.i++
					s.closed(top)
					stack = stack[:len(stack)-1]
					kind = '{'
					break
				}
				if err := s.key(top, &w); err != nil {
					return w, err
				}
				continue
			}
			if s.peek() == ']' {
				s.i++
				s.closed(top)
				stack = stack[:len(stack)-1]
				kind = '['
				break
			}
			continue
		case '"':
			raw, text, lower, err := s.strText()
			if err != nil {
				return w, err
			}
			if s.view != nil {
				s.view.add(KindString, s.i-len(raw)-2, s.i)
			}
			k := key
			var parent *frame
			if len(stack) > 0 {
				parent = &stack[len(stack)-1]
				k = keyNone
				if parent.obj {
					k = parent.key
				}
			}
			t, media := stringTokens(raw, text, k, parent)
			w.tokens = satAdd(w.tokens, t)
			if media {
				w.media = satAdd(w.media, t)
			} else if t == text {
				// Counted as text (a payload waiting for its media type is not).
				w.lower = satAdd(w.lower, lower)
			}
			kind = '"'
		default:
			lit, err := s.literal()
			if err != nil {
				return w, err
			}
			number := lit[0] == '-' || (lit[0] >= '0' && lit[0] <= '9')
			if number {
				w.tokens++ // a token id, or a number in a part
				w.lower++
			}
			if s.view != nil {
				k := KindLiteral
				if number {
					k = KindNumber
				}
				s.view.add(k, s.i-len(lit), s.i)
			}
		}
		// A value is complete: close every container it completes.
		for {
			if len(stack) == 0 {
				return w, nil
			}
			top := &stack[len(stack)-1]
			if !top.obj && len(stack) == 1 {
				w.elems++
				if kind == '"' || kind == '[' {
					w.prompts++
				}
			}
			switch s.peek() {
			case ',':
				s.i++
				if top.obj {
					if err := s.key(top, &w); err != nil {
						return w, err
					}
				}
			case '}':
				if !top.obj {
					return w, errSyntax
				}
				s.i++
				s.closed(top)
				p := top.media.price()
				w.tokens = satAdd(w.tokens, p)
				if top.media.isMedia() {
					w.media = satAdd(w.media, p)
				}
				stack = stack[:len(stack)-1]
				kind = '{'
				continue
			case ']':
				if top.obj {
					return w, errSyntax
				}
				s.i++
				s.closed(top)
				stack = stack[:len(stack)-1]
				kind = '['
				continue
			default:
				return w, errSyntax
			}
			break
		}
	}
}

// key reads an object's next key and the colon after it: the key counts as text, and
// it says what the value after it is for media (the last occurrence of a key counts).
func (s *scanner) key(obj *frame, w *walked) error {
	raw, text, _, err := s.strText()
	if err != nil {
		return err
	}
	if s.view != nil {
		s.view.add(KindKey, s.i-len(raw)-2, s.i)
	}
	if err := s.expect(':'); err != nil {
		return err
	}
	w.tokens += text
	obj.key = classifyKey(raw)
	obj.media.forget(obj.key)
	return nil
}

// closed ends a container in the view; s stands past its last byte.
func (s *scanner) closed(f *frame) {
	if s.view != nil {
		s.view.close(f.node, s.i)
	}
}

// containerKind is the kind of the container c opens.
func containerKind(c byte) Kind {
	if c == '{' {
		return KindObject
	}
	return KindArray
}

// span walks one value and returns its raw bytes.
func (s *scanner) span(depth int) ([]byte, walked, error) {
	s.ws()
	start := s.i
	w, err := s.walk(depth, keyNone)
	if err != nil {
		return nil, w, err
	}
	return s.b[start:s.i], w, nil
}

// object walks the top-level object, calling fn with each raw key when the scanner
// stands at its value; fn must consume the value.
func (s *scanner) object(fn func(key []byte) error) error {
	if err := s.expect('{'); err != nil {
		return err
	}
	root := frame{obj: true}
	if s.view != nil {
		root.node = s.view.add(KindObject, s.i-1, s.i)
	}
	if s.peek() == '}' {
		s.i++
		s.closed(&root)
		return nil
	}
	for {
		raw, err := s.str()
		if err != nil {
			return err
		}
		if s.view != nil {
			s.view.add(KindKey, s.i-len(raw)-2, s.i)
		}
		if err := s.expect(':'); err != nil {
			return err
		}
		if err := fn(raw); err != nil {
			return err
		}
		switch s.peek() {
		case ',':
			s.i++
		case '}':
			s.i++
			s.closed(&root)
			return nil
		default:
			return errSyntax
		}
	}
}

// decodeString turns a raw string's bytes into the string encoding/json decodes:
// escapes resolved, invalid UTF-8 and lone surrogates replaced by U+FFFD.
func decodeString(raw []byte) string {
	if !needsDecoding(raw) {
		return string(raw)
	}
	q := make([]byte, 0, len(raw)+2)
	q = append(append(append(q, '"'), raw...), '"')
	var s string
	if err := json.Unmarshal(q, &s); err != nil {
		return string(raw) // unreachable: str accepted the same grammar
	}
	return s
}

func needsDecoding(raw []byte) bool {
	for _, c := range raw {
		if c == '\\' {
			return true
		}
	}
	return !utf8.Valid(raw)
}

// textRaw is the generous count of a string's text as written (Text's count of its
// decoded form or more: an escape counts as the bytes it is written with).
func textRaw(raw []byte) int64 {
	gen, _ := textCounts(raw)
	return gen
}
