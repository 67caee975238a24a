// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// decodeJSON decodes a JSON document into c as strictly as the YAML path does: an
// unknown field, a duplicate key or anything after the document is an error.
func decodeJSON(data []byte, c *Config) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(c); err != nil {
		return err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return errors.New("more than one JSON value in the document")
	}
	return duplicateKey(data)
}

// duplicateKey returns an error naming the first key that appears twice in one object
// of a valid JSON document (encoding/json keeps the last silently; YAML refuses it).
// It scans the bytes once, without decoding values.
func duplicateKey(data []byte) error {
	// The frames are reused: a document of 50,000 keys has 50,000 small objects.
	var stack []frame
	top := func() *frame {
		if len(stack) == 0 {
			return nil
		}
		return &stack[len(stack)-1]
	}
	push := func(object bool) {
		if len(stack) < cap(stack) {
			stack = stack[:len(stack)+1]
			f := &stack[len(stack)-1]
			f.object, f.expectKey, f.keys, f.set = object, object, f.keys[:0], nil
			return
		}
		stack = append(stack, frame{object: object, expectKey: object})
	}
	for i := 0; i < len(data); i++ {
		switch data[i] {
		case '{':
			push(true)
		case '[':
			push(false)
		case '}', ']':
			if len(stack) > 0 {
				stack = stack[:len(stack)-1]
			}
		case ':':
			if f := top(); f != nil {
				f.expectKey = false
			}
		case ',':
			if f := top(); f != nil && f.object {
				f.expectKey = true
			}
		case '"':
			start := i + 1
			escaped := false
			for i++; i < len(data) && data[i] != '"'; i++ {
				if data[i] == '\\' {
					escaped = true
					i++
				}
			}
			f := top()
			if f == nil || !f.object || !f.expectKey {
				continue
			}
			key := data[start:i]
			if escaped {
				var s string
				if err := json.Unmarshal(data[start-1:i+1], &s); err != nil {
					return err
				}
				key = []byte(s)
			}
			if f.seen(key) {
				return fmt.Errorf("key %q appears twice in one object", key)
			}
		}
	}
	return nil
}

// frame is an object or an array being scanned by duplicateKey.
type frame struct {
	object bool
	// expectKey says the next string is a key: after '{' or ','.
	expectKey bool
	// keys are the object's keys so far; set holds them too once there are many.
	keys [][]byte
	set  map[string]struct{}
}

// seen records key and reports whether the object already had it.
func (f *frame) seen(key []byte) bool {
	if f.set != nil {
		if _, ok := f.set[string(key)]; ok {
			return true
		}
		f.set[string(key)] = struct{}{}
		return false
	}
	for _, k := range f.keys {
		if bytes.Equal(k, key) {
			return true
		}
	}
	f.keys = append(f.keys, key)
	if len(f.keys) > 16 {
		f.set = make(map[string]struct{}, 2*len(f.keys))
		for _, k := range f.keys {
			f.set[string(k)] = struct{}{}
		}
		f.keys = nil
	}
	return false
}
