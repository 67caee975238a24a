// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestValidate(t *testing.T) {
	dir := t.TempDir()
	write := func(name, doc string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(doc), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	cases := []struct {
		name, doc   string
		code        int
		out, errOut string
	}{
		{"the sample", "", 0, "config/samples/proxy.yaml: valid", ""},
		{"a warning", "upstreams: [{name: a, url: 'http://x'}]\nrate_limiting: {limits: {global: {tokens_per_minute: 5}}}", 0,
			"warning: rate_limiting: in-memory token budgets with no budget_division", ""},
		{"an invalid field", "upstreams: [{name: a, url: 'http://x'}]\nrate_limiting: {limits: {global: {tokens_per_minute: -5}}}", 1,
			"", "rate_limiting.limits.global.tokens_per_minute: must not be negative"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			path := "../../../config/samples/proxy.yaml"
			if c.doc != "" {
				path = write(strings.ReplaceAll(c.name, " ", "_")+".yaml", c.doc)
			}
			var out, errOut bytes.Buffer
			code := validate([]string{path}, &out, &errOut)
			if code != c.code {
				t.Fatalf("exit %d, want %d; stdout %q stderr %q", code, c.code, out.String(), errOut.String())
			}
			if !strings.Contains(strings.ReplaceAll(out.String(), "../../../", ""), c.out) {
				t.Errorf("stdout %q lacks %q", out.String(), c.out)
			}
			if !strings.Contains(errOut.String(), c.errOut) {
				t.Errorf("stderr %q lacks %q", errOut.String(), c.errOut)
			}
		})
	}
}
