// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package server

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
)

// TestHeaderWriterValuesPastItsBuffer: values that do not fit the writer's buffer
// still reach their headers whole, and those before them are unchanged.
func TestHeaderWriterValuesPastItsBuffer(t *testing.T) {
	var w headerWriter
	want := map[string]string{}
	for i := range 40 {
		key := fmt.Sprintf("X-Test-%d", i)
		v := fmt.Sprintf("%d-%s", i, strings.Repeat("v", 10+i*3))
		w.value(key, []byte(v))
		want[key] = v
	}
	h := http.Header{}
	w.flush(h)
	for k, v := range want {
		if got := h.Get(k); got != v {
			t.Errorf("%s = %q, want %q", k, got, v)
		}
	}
}
