// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package accesslog

import (
	"encoding/json"
	"testing"
)

// FuzzJSONString checks the access log's string encoding against encoding/json's on
// any string: byte for byte the same, so a line is valid JSON whatever a client
// named its model or a platform team its key.
func FuzzJSONString(f *testing.F) {
	for _, s := range []string{"", "gpt-4o", `a"b\c`, "\x00\x01\x1f\x7f", "line\nbreak\r\t", "<script>&",
		"\xff\xfe invalid", "caf\u00e9 \u2028\u2029 \U0001F600", "\xe2\x80", "trailing\\"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		want, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		if got := appendJSONString(nil, s); string(got) != string(want) {
			t.Fatalf("appendJSONString(%q) = %s, encoding/json: %s", s, got, want)
		}
	})
}
