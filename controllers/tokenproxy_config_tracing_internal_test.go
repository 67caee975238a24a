// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package controllers

import (
	"flag"
	"io"
	"strings"
	"testing"

	twv1alpha1 "github.com/tokenwarden/tokenwarden/api/v1alpha1"
	"github.com/tokenwarden/tokenwarden/proxy/config"
)

// TestProxyTracingFlags is the chart's proxyTracing as the operator reads it, and
// the tracing it renders into a fleet that sets none.
func TestProxyTracingFlags(t *testing.T) {
	parse := func(args ...string) (*twv1alpha1.TracingSpec, error) {
		fs := flag.NewFlagSet("operator", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		read := ProxyTracingFlags(fs)
		if err := fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		return read()
	}
	if s, err := parse(); s != nil || err != nil {
		t.Fatalf("without --proxy-tracing: want no tracing, got %+v, %v", s, err)
	}
	spec, err := parse("--proxy-tracing", "--proxy-tracing-endpoint=http://collector:4318", "--proxy-tracing-protocol=http/protobuf",
		"--proxy-tracing-sample-ratio=0.5")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		flag string
	}{
		{[]string{"--proxy-tracing", "--proxy-tracing-protocol=thrift"}, "--proxy-tracing-protocol"},
		{[]string{"--proxy-tracing", "--proxy-tracing-sample-ratio=1.5"}, "--proxy-tracing-sample-ratio"},
		{[]string{"--proxy-tracing", "--proxy-tracing-endpoint=http://a b"}, "--proxy-tracing-endpoint"},
	} {
		if _, err := parse(c.args...); err == nil || !strings.HasPrefix(err.Error(), c.flag+":") {
			t.Errorf("%v: want an error naming %s, got %v", c.args, c.flag, err)
		}
	}

	r := &TokenProxyReconciler{DefaultTracing: spec}
	var c config.Config
	r.defaultTracing(&c, &twv1alpha1.TokenProxy{})
	got := c.Observability.Tracing
	if !got.Enabled || got.Endpoint != "http://collector:4318" || got.Protocol != config.TracingHTTP || got.SampleRatio == nil || *got.SampleRatio != 0.5 {
		t.Errorf("a fleet that sets no tracing: want the operator's, got %+v", got)
	}
	if err := c.Validate(); err != nil && strings.Contains(err.Error(), "observability") {
		t.Errorf("the rendered tracing must load in the proxy: %v", err)
	}

	own := &twv1alpha1.TokenProxy{Spec: twv1alpha1.TokenProxySpec{Observability: &twv1alpha1.ObservabilitySpec{
		Tracing: &twv1alpha1.TracingSpec{Enabled: false}}}}
	c = config.Config{}
	r.defaultTracing(&c, own)
	if c.Observability.Tracing.Enabled {
		t.Error("a fleet that sets its own tracing keeps it, even off")
	}
}
