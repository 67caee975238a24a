// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package estimate

import (
	"bytes"
	"errors"
	"strconv"
)

// The estimate walks the request body once, in place, without building values: a
// small JSON scanner that counts the text of every string it passes. Anything that is
// not strict JSON stops it, and the caller falls back to the conservative estimate, so
// a body the scanner cannot read is never cheaper than one it can.

var errSyntax = errors.New("estimate: not JSON")

type scanner struct {
	b []byte
	i int
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
	if s.peek() != '"' {
		return nil, errSyntax
	}
	s.i++
	start := s.i
	for s.i < len(s.b) {
		switch c := s.b[s.i]; {
		case c == '"':
			raw := s.b[start:s.i]
			s.i++
			return raw, nil
		case c == '\\':
			if s.i+1 >= len(s.b) {
				return nil, errSyntax
			}
			switch s.b[s.i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				s.i += 2
			case 'u':
				if s.i+6 > len(s.b) || !isHex4(s.b[s.i+2:s.i+6]) {
					return nil, errSyntax
				}
				s.i += 6
			default:
				return nil, errSyntax
			}
		case c < 0x20:
			return nil, errSyntax
		default:
			s.i++
		}
	}
	return nil, errSyntax
}

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

// count walks one value and returns its tokens: the text of every string (object keys
// excluded), one per number, MediaTokens per binary payload. key is the object key the
// value sits under ("" in an array).
func (s *scanner) count(key []byte) (int64, error) {
	switch s.peek() {
	case '"':
		raw, err := s.str()
		if err != nil {
			return 0, err
		}
		if isMediaRaw(key, raw) {
			return MediaTokens, nil
		}
		return textRaw(raw), nil
	case '{':
		var n int64
		err := s.object(func(k []byte) error {
			v, err := s.count(k)
			n += v
			return err
		})
		return n, err
	case '[':
		var n int64
		err := s.array(func() error {
			v, err := s.count(nil)
			n += v
			return err
		})
		return n, err
	default:
		lit, err := s.literal()
		if err != nil {
			return 0, err
		}
		if lit[0] == '-' || (lit[0] >= '0' && lit[0] <= '9') {
			return 1, nil // a token id, or a number in a part
		}
		return 0, nil
	}
}

// span walks one value and returns its raw bytes.
func (s *scanner) span() ([]byte, error) {
	s.ws()
	start := s.i
	if _, err := s.count(nil); err != nil {
		return nil, err
	}
	return s.b[start:s.i], nil
}

// items walks an array, each element with the message floor; a non-array value is
// counted as it is.
func (s *scanner) items() (int64, error) {
	if s.peek() != '[' {
		return s.count(nil)
	}
	var n int64
	err := s.array(func() error {
		v, err := s.count(nil)
		n += MessageFloor + v
		return err
	})
	return n, err
}

// object walks an object, calling fn with each key when the scanner stands at its
// value; fn must consume the value.
func (s *scanner) object(fn func(key []byte) error) error {
	if err := s.expect('{'); err != nil {
		return err
	}
	if s.peek() == '}' {
		s.i++
		return nil
	}
	for {
		key, err := s.str()
		if err != nil {
			return err
		}
		if err := s.expect(':'); err != nil {
			return err
		}
		if err := fn(key); err != nil {
			return err
		}
		switch s.peek() {
		case ',':
			s.i++
		case '}':
			s.i++
			return nil
		default:
			return errSyntax
		}
	}
}

// array walks an array, calling fn when the scanner stands at each element; fn must
// consume it.
func (s *scanner) array(fn func() error) error {
	if err := s.expect('['); err != nil {
		return err
	}
	if s.peek() == ']' {
		s.i++
		return nil
	}
	for {
		if err := fn(); err != nil {
			return err
		}
		switch s.peek() {
		case ',':
			s.i++
		case ']':
			s.i++
			return nil
		default:
			return errSyntax
		}
	}
}

// unquote turns a raw string's bytes into the string, handling escapes when present.
func unquote(raw []byte) string {
	if bytes.IndexByte(raw, '\\') < 0 {
		return string(raw)
	}
	q := make([]byte, 0, len(raw)+2)
	q = append(append(append(q, '"'), raw...), '"')
	s, err := strconv.Unquote(string(q))
	if err != nil {
		return string(raw)
	}
	return s
}

// textRaw is Text over a raw (escaped) string: an escape counts as its ASCII bytes,
// which over-counts slightly and never under-counts.
func textRaw(raw []byte) int64 {
	var ascii, other int64
	for i := 0; i < len(raw); {
		c := raw[i]
		if c < 0x80 {
			ascii++
			i++
			continue
		}
		// Count one token per UTF-8 sequence: skip its continuation bytes.
		i++
		for i < len(raw) && raw[i]&0xC0 == 0x80 {
			i++
		}
		other++
	}
	return (ascii+3)/4 + other
}

func isMediaRaw(key, raw []byte) bool {
	if len(raw) > 5 && string(raw[:5]) == "data:" {
		return true
	}
	switch string(key) {
	case "data", "file_data", "b64_json":
		return len(raw) > 5
	}
	return false
}

// Fields calls fn with the raw bytes of each top-level field of a JSON object, in
// order, without decoding them. It fails on anything that is not strict JSON.
func Fields(body []byte, fn func(key, value []byte)) error {
	s := &scanner{b: body}
	return s.object(func(key []byte) error {
		v, err := s.span()
		if err == nil {
			fn(key, v)
		}
		return err
	})
}
