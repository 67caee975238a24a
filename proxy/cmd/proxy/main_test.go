// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tokenwarden/tokenwarden/proxy/adminauth"
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

func TestAdminAuthMode(t *testing.T) {
	cases := []struct {
		name, flag string
		configMap  bool
		want       adminauth.Mode
		err        string
	}{
		{"in a cluster the admin API is guarded by default", "", true, adminauth.ModeKubernetes, ""},
		{"standalone it is open by default, on 127.0.0.1", "", false, adminauth.ModeNone, ""},
		{"a standalone proxy may ask the API server", "kubernetes", false, adminauth.ModeKubernetes, ""},
		{"a proxy in a cluster may be opened explicitly", "none", true, adminauth.ModeNone, ""},
		{"another value is refused", "basic", true, "", `--admin-auth: want "kubernetes" or "none", got "basic"`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := adminAuthMode(c.flag, c.configMap)
			if c.err != "" {
				if err == nil || err.Error() != c.err {
					t.Fatalf("err = %v, want %s", err, c.err)
				}
				return
			}
			if err != nil || got != c.want {
				t.Fatalf("adminAuthMode(%q, %v) = %q, %v; want %q", c.flag, c.configMap, got, err, c.want)
			}
		})
	}
}

func TestRunRefusesAnUnknownAdminAuth(t *testing.T) {
	err := run([]string{"--config", "../../../config/samples/proxy.yaml", "--admin-auth", "basic"})
	if err == nil || !strings.Contains(err.Error(), "--admin-auth") {
		t.Fatalf("run = %v, want an --admin-auth error", err)
	}
}
