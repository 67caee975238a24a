// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package usage

import (
	"encoding/json"
	"strings"
	"testing"
)

// FuzzScanValid checks that the scanner judges validity exactly as encoding/json
// does, however the input is split.
func FuzzScanValid(f *testing.F) {
	for _, s := range []string{`{}`, `[]`, `{"a":[1,-0,0.5,1e10,-1E-2,true,false,null,"x\"\\\/\b\f\n\r\t\u00e9"]}`, `01`, `1.`, `-`, `1e`, `"\x"`,
		`{"a":1,}`, `[1,]`, `{"a" 1}`, `{"a":1}{}`, `  "s"  `, "\"\x01\"", `nul`, `truex`, `{"a":{"b":[[]]}}`, `"\ud800"`} {
		f.Add([]byte(s), uint8(1))
	}
	f.Fuzz(func(t *testing.T, doc []byte, split uint8) {
		want := json.Valid(doc)
		for _, n := range []int{len(doc) + 1, int(split%16) + 1} {
			var s scanner
			s.reset(bodyTree)
			for i := 0; i < len(doc); i += n {
				s.write(doc[i:min(i+n, len(doc))])
			}
			if got := s.finish(); got != want {
				t.Fatalf("split %d: valid %v, encoding/json says %v", n, got, want)
			}
		}
	})
}

func TestScanDepth(t *testing.T) {
	for _, c := range []struct {
		depth int
		valid bool
	}{{128, true}, {129, true}, {10000, true}, {10001, false}} {
		var s scanner
		s.reset(bodyTree)
		s.write([]byte(strings.Repeat(`{"a":[`, c.depth/2) + strings.Repeat("[", c.depth%2) + strings.Repeat("]", c.depth%2) + strings.Repeat(`]}`, c.depth/2)))
		if got := s.finish(); got != c.valid || json.Valid([]byte(strings.Repeat(`{"a":[`, c.depth/2)+strings.Repeat("[", c.depth%2)+strings.Repeat("]", c.depth%2)+strings.Repeat(`]}`, c.depth/2))) != c.valid {
			t.Errorf("depth %d: valid %v, want %v", c.depth, got, c.valid)
		}
	}
}
