// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package server

import (
	"net/http"
	"slices"
	"testing"
)

func TestOfferEncodings(t *testing.T) {
	for _, c := range []struct {
		in   []string
		want []string
	}{
		{nil, nil},
		{[]string{"gzip, deflate"}, []string{"gzip, deflate"}},
		{[]string{"gzip, deflate, br, zstd"}, []string{"gzip, deflate"}},
		{[]string{"br;q=1.0, GZIP;q=0.8", "x-gzip"}, []string{"GZIP;q=0.8, x-gzip"}},
		{[]string{"br"}, []string{"identity"}},
		{[]string{"*"}, []string{"identity"}},
		{[]string{"identity;q=1, *;q=0"}, []string{"identity;q=1"}},
	} {
		h := http.Header{}
		for _, v := range c.in {
			h.Add("Accept-Encoding", v)
		}
		offerEncodings(h)
		if got := h.Values("Accept-Encoding"); !slices.Equal(got, c.want) {
			t.Errorf("%q: offered %q, want %q", c.in, got, c.want)
		}
	}
}

func TestContentCodings(t *testing.T) {
	for _, c := range []struct {
		in   []string
		want []string
		ok   bool
	}{
		{nil, nil, true},
		{[]string{"identity"}, nil, true},
		{[]string{"GZIP"}, []string{"gzip"}, true},
		{[]string{"x-gzip"}, []string{"gzip"}, true},
		{[]string{"deflate, gzip"}, []string{"deflate", "gzip"}, true},
		{[]string{"gzip", "br"}, nil, false},
		{[]string{"zstd"}, nil, false},
		{[]string{"compress"}, nil, false},
	} {
		h := http.Header{}
		for _, v := range c.in {
			h.Add("Content-Encoding", v)
		}
		got, ok := contentCodings(h)
		if ok != c.ok || !slices.Equal(got, c.want) {
			t.Errorf("%q: codings %q %v, want %q %v", c.in, got, ok, c.want, c.ok)
		}
	}
}

func TestStripUpstreamLimits(t *testing.T) {
	h := http.Header{"X-Ratelimit-Remaining-Tokens": {"1"}, "Anthropic-Ratelimit-Requests-Limit": {"1"}, "Ratelimit": {"x"},
		"Retry-After": {"3"}, "Retry-After-Ms": {"3000"}, "X-Request-Id": {"r"}, "x-ratelimit-limit-requests": {"1"}}
	failed := h.Clone()
	stripUpstreamLimits(h, true)
	if len(h) != 1 || h.Get("X-Request-Id") != "r" {
		t.Errorf("a 2xx kept %v", h)
	}
	stripUpstreamLimits(failed, false)
	if len(failed) != 3 || failed.Get("Retry-After") != "3" || failed.Get("Retry-After-Ms") != "3000" {
		t.Errorf("a failed answer kept %v", failed)
	}
}
