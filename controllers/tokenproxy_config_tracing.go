// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package controllers

import (
	"flag"
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"

	twv1alpha1 "github.com/tokenwarden/tokenwarden/api/v1alpha1"
	"github.com/tokenwarden/tokenwarden/controllers/render"
	"github.com/tokenwarden/tokenwarden/proxy/config"
)

// ProxyTracingFlags binds the operator's --proxy-tracing-* flags, the tracing of
// every fleet whose TokenProxy sets no spec.observability.tracing (the chart's
// proxyTracing values). The function returned reads them after parsing: nil when
// tracing is off, an error naming the flag for a bad value.
func ProxyTracingFlags(fs *flag.FlagSet) func() (*twv1alpha1.TracingSpec, error) {
	on := fs.Bool("proxy-tracing", false, "Trace every fleet whose TokenProxy sets no spec.observability.tracing, by OTLP.")
	endpoint := fs.String("proxy-tracing-endpoint", "", "With --proxy-tracing: the OTLP collector's URL, for example http://otel-collector.monitoring:4317.")
	protocol := fs.String("proxy-tracing-protocol", string(twv1alpha1.TracingGRPC), "With --proxy-tracing: grpc or http/protobuf.")
	insecure := fs.Bool("proxy-tracing-insecure", false, "With --proxy-tracing: send without TLS to an endpoint given as host:port.")
	ratio := fs.String("proxy-tracing-sample-ratio", "1", "With --proxy-tracing: the fraction, from 0 to 1, of new traces sampled.")
	return func() (*twv1alpha1.TracingSpec, error) {
		if !*on {
			return nil, nil
		}
		switch p := twv1alpha1.TracingProtocol(*protocol); p {
		case twv1alpha1.TracingGRPC, twv1alpha1.TracingHTTP:
		default:
			return nil, fmt.Errorf("--proxy-tracing-protocol: want %q or %q, got %q", twv1alpha1.TracingGRPC, twv1alpha1.TracingHTTP, p)
		}
		q, err := resource.ParseQuantity(*ratio)
		if err != nil || q.Sign() < 0 || q.Cmp(resource.MustParse("1")) > 0 {
			return nil, fmt.Errorf("--proxy-tracing-sample-ratio: want a number from 0 to 1, got %q", *ratio)
		}
		if strings.ContainsAny(*endpoint, " \t\n") {
			return nil, fmt.Errorf("--proxy-tracing-endpoint: want a URL or host:port, got %q", *endpoint)
		}
		return &twv1alpha1.TracingSpec{Enabled: true, Endpoint: *endpoint, Protocol: twv1alpha1.TracingProtocol(*protocol),
			Insecure: *insecure, SampleRatio: &q}, nil
	}
}

// defaultTracing renders the operator's tracing into a fleet's document when its
// TokenProxy sets none.
func (r *TokenProxyReconciler) defaultTracing(c *config.Config, tp *twv1alpha1.TokenProxy) {
	if r.DefaultTracing == nil || (tp.Spec.Observability != nil && tp.Spec.Observability.Tracing != nil) {
		return
	}
	o := twv1alpha1.ObservabilitySpec{Tracing: r.DefaultTracing}
	var rendered config.Config
	render.Observability(&rendered, &o)
	c.Observability.Tracing = rendered.Observability.Tracing
}
