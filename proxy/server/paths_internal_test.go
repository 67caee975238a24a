// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package server

import (
	"net/url"
	"strings"
	"testing"
)

func TestClassifyCanonicalPaths(t *testing.T) {
	for _, c := range []struct {
		raw, name, path string
	}{
		{"/v1/chat/completions", "/v1/chat/completions", "/v1/chat/completions"},
		{"//v1/chat/completions", "/v1/chat/completions", "/v1/chat/completions"},
		{"/v1//chat/completions", "/v1/chat/completions", "/v1/chat/completions"},
		{"/v1/chat/./completions", "/v1/chat/completions", "/v1/chat/completions"},
		{"/v1/chat/x/../completions", "/v1/chat/completions", "/v1/chat/completions"},
		{"/v1/chat/completions/", "/v1/chat/completions", "/v1/chat/completions"},
		{"/v1/chat/completions/.", "/v1/chat/completions", "/v1/chat/completions"},
		{"/../../v1/chat/completions", "/v1/chat/completions", "/v1/chat/completions"},
		{"/v1/%63hat/completions", "/v1/chat/completions", "/v1/chat/completions"},
		{"/v1/chat/%2e/completions", "/v1/chat/completions", "/v1/chat/completions"},
		{"/v1/chat%2Fcompletions", "/v1/chat/completions", "/v1/chat/completions"},
		{"/v1/chat%2fx%2F..%2Fcompletions", "/v1/chat/completions", "/v1/chat/completions"},
		{`/v1/chat%5Ccompletions`, "/v1/chat/completions", "/v1/chat/completions"},
		{"/V1/Chat/Completions", "/v1/chat/completions", "/v1/chat/completions"},
		{"/anthropic//v1/messages", "/anthropic/v1/messages", "/anthropic/v1/messages"},
		{"/anthropic/../v1/messages/", "/v1/messages", "/v1/messages"},
		{"/v1/responses/./compact", "/v1/responses/compact", "/v1/responses/compact"},
		{"/v1/models/", "other", "/v1/models"},
		{"/v1/models/org%2Fmodel", "other", "/v1/models/org%2Fmodel"},
		{"/v1/files/a%7eb%41", "other", "/v1/files/a~bA"},
		{"/v1/files/a%3f", "other", "/v1/files/a%3F"},
		{"/v1/chat/completions%252F", "other", "/v1/chat/completions%252F"},
		{"/", "other", "/"},
		{"//", "other", "/"},
		{"/..", "other", "/"},
	} {
		u, err := url.Parse("http://proxy" + c.raw)
		if err != nil {
			t.Fatal(err)
		}
		r := classify(u)
		if r.name != c.name || r.path != c.path {
			t.Errorf("%s: classified %q forwarding %q, want %q forwarding %q", c.raw, r.name, r.path, c.name, c.path)
		}
	}
}

func TestCanonicalPathDoesNotAllocate(t *testing.T) {
	if n := testing.AllocsPerRun(100, func() { _ = classify(&url.URL{Path: "/v1/chat/completions"}) }); n != 0 {
		t.Errorf("classifying a canonical charged path allocates %v times", n)
	}
}

// FuzzCanonicalPath checks that the canonical form is canonical: stable, rooted, with
// no empty or dot segment and no trailing slash, and a valid escaped path.
func FuzzCanonicalPath(f *testing.F) {
	for _, s := range []string{"/v1/chat/completions", "//a/./b/../c/", "/%2e%2E/%41%2f", "/a/%zz", "/../..", "/a//"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, p string) {
		if !strings.HasPrefix(p, "/") {
			return
		}
		c := canonicalPath(p)
		if canonicalPath(c) != c {
			t.Fatalf("%q: canonical %q is not stable: %q", p, c, canonicalPath(c))
		}
		if !strings.HasPrefix(c, "/") || c != "/" && strings.HasSuffix(c, "/") || strings.Contains(c, "//") {
			t.Fatalf("%q: canonical %q is not canonical", p, c)
		}
		for _, seg := range strings.Split(c[1:], "/") {
			if seg == "." || seg == ".." {
				t.Fatalf("%q: canonical %q keeps a dot segment", p, c)
			}
		}
		if _, err := url.PathUnescape(p); err == nil {
			if _, err := url.PathUnescape(c); err != nil {
				t.Fatalf("%q: canonical %q is not a valid escaped path", p, c)
			}
		}
	})
}
