// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package config

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strings"
)

// Observability is what the proxy tells about each request: an access log line, an
// OpenTelemetry trace, and the last refusals per API key (docs/observability.md).
type Observability struct {
	// AccessLog is the per-request log. It is on unless disabled.
	AccessLog AccessLog `json:"access_log,omitzero"`
	// Tracing exports OpenTelemetry traces by OTLP. It is off unless enabled.
	Tracing Tracing `json:"tracing,omitzero"`
	// RefusalAudit keeps each API key's last refusals for /admin/refusals.
	RefusalAudit RefusalAudit `json:"refusal_audit,omitzero"`
}

// AccessLog configures the access log: one JSON line per request on the proxy's
// standard output, written off the request path.
type AccessLog struct {
	// Disabled turns the access log off. Default false: every request is logged.
	Disabled bool `json:"disabled,omitempty"`
	// SampleRatio is the fraction, from 0 to 1, of answered requests (status below
	// 400) that are logged; every refusal and error is logged whatever it says. Absent:
	// 1 (all of them). 0 logs no answered request.
	SampleRatio *float64 `json:"sample_ratio,omitempty"`
	// Fields, when set, are the only fields written (time, msg and request_id always
	// are); absent or empty: every field. Names from AccessLogFields.
	Fields []string `json:"fields,omitempty"`
	// BufferLines bounds the lines waiting to be written; a line that finds the
	// buffer full is dropped and counted (tokenwarden_access_log_lines_total{result=
	// "dropped"}). Absent or 0: 4096.
	BufferLines int64 `json:"buffer_lines,omitempty"`
}

// DefaultAccessLogBufferLines is access_log.buffer_lines when absent.
const DefaultAccessLogBufferLines = 4096

// AccessLogFields are the fields of an access log line that access_log.fields may
// select (docs/observability.md "Access log").
var AccessLogFields = []string{
	"route", "method", "model", "api_key", "user", "team", "client", "status", "decision", "error",
	"refusal", "tokens_reserved", "usage", "settlement", "upstream", "upstream_request_id",
	"upstream_latency_ms", "latency_ms", "bytes_in", "bytes_out", "trace_id", "cache",
	"output_admitted", "cache_age_seconds",
}

// Sample is access_log.sample_ratio in force.
func (a *AccessLog) Sample() float64 {
	if a.SampleRatio == nil {
		return 1
	}
	return *a.SampleRatio
}

// Buffer is access_log.buffer_lines in force.
func (a *AccessLog) Buffer() int { return int(cmp.Or(a.BufferLines, DefaultAccessLogBufferLines)) }

// Tracing protocols.
const (
	TracingGRPC = "grpc"
	TracingHTTP = "http/protobuf"
)

// Tracing configures OpenTelemetry tracing. The standard OTEL_* environment variables
// (OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_EXPORTER_OTLP_HEADERS, OTEL_SERVICE_NAME,
// OTEL_RESOURCE_ATTRIBUTES, OTEL_TRACES_SAMPLER, ...) apply to what a field leaves
// unset. Tracing is set up when the proxy starts: a change of it takes effect at the
// next restart.
type Tracing struct {
	// Enabled turns tracing on. Default false.
	Enabled bool `json:"enabled,omitempty"`
	// Protocol is "grpc" or "http/protobuf". Absent: $OTEL_EXPORTER_OTLP_TRACES_PROTOCOL,
	// $OTEL_EXPORTER_OTLP_PROTOCOL, or grpc.
	Protocol string `json:"protocol,omitempty"`
	// Endpoint is the OTLP collector's URL (http://collector:4317 for grpc,
	// http://collector:4318 for http/protobuf, which adds /v1/traces when the URL has
	// no path) or host:port. Absent: the OTEL_EXPORTER_OTLP_* variables, or the
	// exporter's default on localhost.
	Endpoint string `json:"endpoint,omitempty"`
	// Insecure sends without TLS to an endpoint given as host:port. An http:// endpoint
	// is plain text anyway.
	Insecure bool `json:"insecure,omitempty"`
	// SampleRatio is the fraction, from 0 to 1, of new traces sampled; a request that
	// comes with a traceparent follows its parent's decision. Absent:
	// $OTEL_TRACES_SAMPLER, or every trace.
	SampleRatio *float64 `json:"sample_ratio,omitempty"`
	// ServiceName is the resource's service.name. Absent: $OTEL_SERVICE_NAME, or
	// "tokenwarden-proxy".
	ServiceName string `json:"service_name,omitempty"`
}

// RefusalAudit bounds the refusals /admin/refusals keeps.
type RefusalAudit struct {
	// PerKey is how many of each API key's last refusals are kept (anonymous callers
	// share one list). Absent or 0: 20; -1 keeps none.
	PerKey int64 `json:"per_key,omitempty"`
}

// DefaultRefusalAuditPerKey is refusal_audit.per_key when absent.
const DefaultRefusalAuditPerKey = 20

// Kept is refusal_audit.per_key in force: 0 when the audit is off.
func (r *RefusalAudit) Kept() int {
	if r.PerKey < 0 {
		return 0
	}
	return int(cmp.Or(r.PerKey, DefaultRefusalAuditPerKey))
}

// maxAccessLogBuffer and maxRefusalAuditPerKey keep a typo from holding gigabytes.
const (
	maxAccessLogBuffer    = 1 << 20
	maxRefusalAuditPerKey = 1000
)

func (c *Config) validateObservability(errs *fieldErrors) {
	o := &c.Observability
	a := &o.AccessLog
	ratio(errs, "observability.access_log.sample_ratio", a.SampleRatio)
	if a.BufferLines < 0 || a.BufferLines > maxAccessLogBuffer {
		errs.add("observability.access_log.buffer_lines", "must be from 1 to %d, got %d", maxAccessLogBuffer, a.BufferLines)
	}
	for i, f := range a.Fields {
		if !slices.Contains(AccessLogFields, f) {
			errs.add(fmt.Sprintf("observability.access_log.fields[%d]", i), "must be one of %s, got %q", strings.Join(AccessLogFields, ", "), f)
		}
	}
	t := &o.Tracing
	switch t.Protocol {
	case "", TracingGRPC, TracingHTTP:
	default:
		errs.add("observability.tracing.protocol", "must be %q or %q, got %q", TracingGRPC, TracingHTTP, t.Protocol)
	}
	if t.Endpoint != "" && strings.ContainsAny(t.Endpoint, " \t\n") {
		errs.add("observability.tracing.endpoint", "must be a URL or host:port, got %q", t.Endpoint)
	}
	ratio(errs, "observability.tracing.sample_ratio", t.SampleRatio)
	if p := o.RefusalAudit.PerKey; p < -1 || p > maxRefusalAuditPerKey {
		errs.add("observability.refusal_audit.per_key", "must be from -1 (none) to %d, got %d", maxRefusalAuditPerKey, p)
	}
}

func ratio(errs *fieldErrors, field string, r *float64) {
	if r != nil && (math.IsNaN(*r) || *r < 0 || *r > 1) {
		errs.add(field, "must be a number from 0 to 1, got %v", *r)
	}
}

// Same reports whether two tracing blocks set up the same tracing.
func (t *Tracing) Same(o *Tracing) bool {
	a, b := *t, *o
	a.SampleRatio, b.SampleRatio = nil, nil
	ra, rb := -1.0, -1.0
	if t.SampleRatio != nil {
		ra = *t.SampleRatio
	}
	if o.SampleRatio != nil {
		rb = *o.SampleRatio
	}
	return a == b && ra == rb
}
