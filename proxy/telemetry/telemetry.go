// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

// Package telemetry builds the proxy's OpenTelemetry tracer provider from the config's
// observability.tracing block and the standard OTEL_* environment variables.
package telemetry

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/tokenwarden/tokenwarden/proxy/config"
)

// DefaultServiceName is service.name when neither the config nor OTEL_SERVICE_NAME
// names one.
const DefaultServiceName = "tokenwarden-proxy"

// Enabled reports whether t turns tracing on: it is enabled, and OTEL_SDK_DISABLED is
// not "true".
func Enabled(t *config.Tracing) bool {
	return t.Enabled && !strings.EqualFold(strings.TrimSpace(os.Getenv("OTEL_SDK_DISABLED")), "true")
}

// NewTracerProvider returns a tracer provider that batches spans to an OTLP exporter
// as t says; the caller shuts it down, which sends what is left. A field t leaves
// unset is read from the OTEL_* environment by the exporter and the SDK.
func NewTracerProvider(ctx context.Context, t *config.Tracing, version string) (*sdktrace.TracerProvider, error) {
	exp, err := newExporter(ctx, t)
	if err != nil {
		return nil, fmt.Errorf("observability.tracing: %w", err)
	}
	attrs := []attribute.KeyValue{attribute.String("service.name", DefaultServiceName)}
	if version != "" {
		attrs = append(attrs, attribute.String("service.version", version))
	}
	// Later options win: the environment over the default name, the config over both.
	opts := []resource.Option{resource.WithAttributes(attrs...), resource.WithFromEnv(), resource.WithTelemetrySDK()}
	if t.ServiceName != "" {
		opts = append(opts, resource.WithAttributes(attribute.String("service.name", t.ServiceName)))
	}
	res, err := resource.New(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("observability.tracing: resource: %w", err)
	}
	tpOpts := []sdktrace.TracerProviderOption{sdktrace.WithBatcher(exp), sdktrace.WithResource(res)}
	if t.SampleRatio != nil {
		tpOpts = append(tpOpts, sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(*t.SampleRatio))))
	}
	return sdktrace.NewTracerProvider(tpOpts...), nil
}

// Protocol is the OTLP protocol in force: the config's, else the environment's, else
// grpc.
func Protocol(t *config.Tracing) string {
	for _, p := range []string{t.Protocol, os.Getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"), os.Getenv("OTEL_EXPORTER_OTLP_PROTOCOL")} {
		if p = strings.TrimSpace(p); p != "" {
			return p
		}
	}
	return config.TracingGRPC
}

func newExporter(ctx context.Context, t *config.Tracing) (*otlptrace.Exporter, error) {
	switch p := Protocol(t); p {
	case config.TracingGRPC:
		var opts []otlptracegrpc.Option
		if t.Endpoint != "" {
			if strings.Contains(t.Endpoint, "://") {
				opts = append(opts, otlptracegrpc.WithEndpointURL(t.Endpoint))
			} else {
				opts = append(opts, otlptracegrpc.WithEndpoint(t.Endpoint))
			}
		}
		if t.Insecure {
			opts = append(opts, otlptracegrpc.WithInsecure())
		}
		return otlptracegrpc.New(ctx, opts...)
	case config.TracingHTTP:
		var opts []otlptracehttp.Option
		if t.Endpoint != "" {
			if strings.Contains(t.Endpoint, "://") {
				u, err := url.Parse(t.Endpoint)
				if err != nil {
					return nil, fmt.Errorf("endpoint: %w", err)
				}
				// A collector's base URL gets the traces path, as OTEL_EXPORTER_OTLP_ENDPOINT does.
				if u.Path == "" || u.Path == "/" {
					u.Path = "/v1/traces"
				}
				opts = append(opts, otlptracehttp.WithEndpointURL(u.String()))
			} else {
				opts = append(opts, otlptracehttp.WithEndpoint(t.Endpoint))
			}
		}
		if t.Insecure {
			opts = append(opts, otlptracehttp.WithInsecure())
		}
		return otlptracehttp.New(ctx, opts...)
	default:
		return nil, fmt.Errorf("protocol: must be %q or %q, got %q", config.TracingGRPC, config.TracingHTTP, p)
	}
}
