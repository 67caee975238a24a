// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package chart

import (
	"os/exec"
	"strings"
	"testing"
)

// TestProxyTracing: proxyTracing becomes the operator's --proxy-tracing-* flags, and
// none of them when it is off; the schema refuses a bad protocol or ratio.
func TestProxyTracing(t *testing.T) {
	helm := tool(t, "helm")
	if off := run(t, helm, "template", "tw", chartDir); strings.Contains(off, "--proxy-tracing") {
		t.Error("tracing is off by default: no --proxy-tracing flag")
	}
	on := run(t, helm, "template", "tw", chartDir, "--set",
		"proxyTracing.enabled=true,proxyTracing.endpoint=http://otel-collector.monitoring:4318,proxyTracing.protocol=http/protobuf,proxyTracing.sampleRatio=0.25")
	for _, want := range []string{
		"- --proxy-tracing=true\n", "- --proxy-tracing-endpoint=http://otel-collector.monitoring:4318\n",
		"- --proxy-tracing-protocol=http/protobuf\n", "- --proxy-tracing-insecure=false\n", "- --proxy-tracing-sample-ratio=0.25\n",
	} {
		if !strings.Contains(on, want) {
			t.Errorf("the operator's args lack %q", want)
		}
	}
	for _, c := range []struct{ set, field string }{
		{"proxyTracing.protocol=thrift", "/proxyTracing/protocol"},
		{"proxyTracing.sampleRatio=2", "/proxyTracing/sampleRatio"},
		{"proxyTracing.endpont=x", "proxyTracing"},
	} {
		out, err := exec.Command(helm, "template", "tw", chartDir, "--set", c.set).CombinedOutput()
		if err == nil || !strings.Contains(string(out), c.field) {
			t.Errorf("--set %s was accepted or %s not named: %v\n%s", c.set, c.field, err, out)
		}
	}
}
