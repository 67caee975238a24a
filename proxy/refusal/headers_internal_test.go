// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package refusal

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

func TestStripUpstreamLimits(t *testing.T) {
	h := http.Header{"X-Ratelimit-Remaining-Tokens": {"1"}, "Anthropic-Ratelimit-Requests-Limit": {"1"}, "Ratelimit": {"x"},
		"Retry-After": {"3"}, "Retry-After-Ms": {"3000"}, "X-Request-Id": {"r"}, "x-ratelimit-limit-requests": {"1"}}
	failed := h.Clone()
	StripUpstreamLimits(h, true)
	if len(h) != 1 || h.Get("X-Request-Id") != "r" {
		t.Errorf("a 2xx kept %v", h)
	}
	StripUpstreamLimits(failed, false)
	if len(failed) != 3 || failed.Get("Retry-After") != "3" || failed.Get("Retry-After-Ms") != "3000" {
		t.Errorf("a failed answer kept %v", failed)
	}
}
