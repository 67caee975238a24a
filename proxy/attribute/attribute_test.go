// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package attribute_test

import (
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/tokenwarden/tokenwarden/proxy/attribute"
)

func TestReadBounds(t *testing.T) {
	for _, c := range []struct {
		name   string
		values []string
		want   string
		bad    string
	}{
		{name: "absent", want: attribute.Absent},
		{name: "empty", values: []string{""}, want: attribute.Absent},
		{name: "uuid", values: []string{"3f2b8c1e-0d4a-4b5e-9a6f-2c7d8e9f0a1b"}, want: "3f2b8c1e-0d4a-4b5e-9a6f-2c7d8e9f0a1b"},
		{name: "punctuation", values: []string{"planner/step:3@ci+x=y"}, want: "planner/step:3@ci+x=y"},
		{name: "longest", values: []string{strings.Repeat("a", attribute.MaxLength)}, want: strings.Repeat("a", attribute.MaxLength)},
		{name: "too long", values: []string{strings.Repeat("a", attribute.MaxLength+1)}, bad: "longer than 256 bytes"},
		{name: "space", values: []string{"my session"}, bad: "byte 0x20 at 2"},
		{name: "tab", values: []string{"a\tb"}, bad: "byte 0x09"},
		{name: "not ascii", values: []string{"séance"}, bad: "byte 0xc3"},
		{name: "twice", values: []string{"a", "b"}, bad: "more than once"},
	} {
		t.Run(c.name, func(t *testing.T) {
			for a := attribute.Session; a < attribute.NumHeaders; a++ {
				h := http.Header{}
				for _, v := range c.values {
					h.Add(a.Name(), v)
				}
				got, err := attribute.Read(h, a)
				if c.bad == "" {
					if err != nil || got != c.want {
						t.Fatalf("%s: got %q, %v; want %q", a, got, err, c.want)
					}
					continue
				}
				var ae *attribute.Error
				if !errors.As(err, &ae) || ae.Header != a || !strings.Contains(err.Error(), c.bad) || !strings.Contains(err.Error(), a.Name()) {
					t.Fatalf("%s: got %q, %v; want an error naming %s with %q", a, got, err, a.Name(), c.bad)
				}
			}
		})
	}
}

func TestHeaderNames(t *testing.T) {
	want := map[attribute.Header][2]string{
		attribute.Session: {"X-Tokenwarden-Session-Id", "session"},
		attribute.Agent:   {"X-Tokenwarden-Agent-Id", "agent"},
		attribute.Task:    {"X-Tokenwarden-Task-Id", "task"},
		attribute.Run:     {"X-Tokenwarden-Run-Id", "run"},
	}
	for a, w := range want {
		if a.Name() != w[0] || a.String() != w[1] || http.CanonicalHeaderKey(a.Name()) != a.Name() {
			t.Errorf("%d: %q %q, want %q %q (canonical)", a, a.Name(), a.String(), w[0], w[1])
		}
	}
}
