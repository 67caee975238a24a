// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package controllers

import (
	"strings"
	"testing"
)

// TestCompareJoined holds the allocation-free order of a fleet's objects to the order
// of their namespace/name keys, which the rendered document follows.
func TestCompareJoined(t *testing.T) {
	parts := []string{"", "a", "a-b", "a/b", "ab", "b", "key-000001", "key-00001", "scale", "scale-x", "z"}
	for _, a1 := range parts {
		for _, a2 := range parts {
			for _, b1 := range parts {
				for _, b2 := range parts {
					want := strings.Compare(a1+"/"+a2, b1+"/"+b2)
					if got := compareJoined(a1, a2, b1, b2); got != want {
						t.Fatalf("compareJoined(%q, %q, %q, %q) = %d, strings.Compare says %d", a1, a2, b1, b2, got, want)
					}
				}
			}
		}
	}
}
