// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package v1alpha1

import "k8s.io/apimachinery/pkg/api/resource"

// ObservabilitySpec is what the fleet's proxies tell about each request: an access
// log line, an OpenTelemetry trace, and the last refusals per key
// (docs/observability.md).
type ObservabilitySpec struct {
	// AccessLog configures the per-request log. Default: every request logged.
	// +optional
	AccessLog *AccessLogSpec `json:"accessLog,omitempty"`
	// Tracing exports OpenTelemetry traces by OTLP. Default: off.
	// +optional
	Tracing *TracingSpec `json:"tracing,omitempty"`
	// RefusalsPerKey is how many of each API key's last refusals a proxy keeps for
	// its /admin/refusals; -1 keeps none. Default 20.
	// +optional
	// +kubebuilder:validation:Minimum=-1
	// +kubebuilder:validation:Maximum=1000
	RefusalsPerKey int64 `json:"refusalsPerKey,omitempty"`
}

// AccessLogSpec configures the proxies' access log: one JSON line per request on
// their standard output.
type AccessLogSpec struct {
	// Disabled turns the access log off. Default false.
	// +optional
	Disabled bool `json:"disabled,omitempty"`
	// SampleRatio is the fraction, from 0 to 1, of answered requests (status below
	// 400) logged; every refusal and error is logged. Default 1.
	// +optional
	// +kubebuilder:validation:XValidation:rule="!quantity(string(self)).isLessThan(quantity('0')) && !quantity(string(self)).isGreaterThan(quantity('1'))",message="sampleRatio must be from 0 to 1"
	SampleRatio *resource.Quantity `json:"sampleRatio,omitempty"`
}

// TracingProtocol is the OTLP transport.
// +kubebuilder:validation:Enum=grpc;http/protobuf
type TracingProtocol string

// OTLP transports.
const (
	TracingGRPC TracingProtocol = "grpc"
	TracingHTTP TracingProtocol = "http/protobuf"
)

// TracingSpec turns OpenTelemetry tracing on: a server span per request with the
// GenAI semantic-convention attributes, and child spans for admission and the
// upstream call. A change takes effect when the proxy pods next start (until then
// their config reports it as restart_required).
type TracingSpec struct {
	// Enabled turns tracing on. Default false.
	// +optional
	Enabled bool `json:"enabled,omitempty"`
	// Protocol is grpc or http/protobuf. Default grpc.
	// +optional
	Protocol TracingProtocol `json:"protocol,omitempty"`
	// Endpoint is the OTLP collector's URL, for example
	// http://otel-collector.monitoring:4317. Default: the exporter's localhost default.
	// +optional
	// +kubebuilder:validation:MaxLength=512
	// +kubebuilder:validation:Pattern=`^[^\s]*$`
	Endpoint string `json:"endpoint,omitempty"`
	// Insecure sends without TLS to an endpoint given as host:port. Default false.
	// +optional
	Insecure bool `json:"insecure,omitempty"`
	// SampleRatio is the fraction, from 0 to 1, of new traces sampled; a request with
	// a traceparent follows its parent's decision. Default 1.
	// +optional
	// +kubebuilder:validation:XValidation:rule="!quantity(string(self)).isLessThan(quantity('0')) && !quantity(string(self)).isGreaterThan(quantity('1'))",message="sampleRatio must be from 0 to 1"
	SampleRatio *resource.Quantity `json:"sampleRatio,omitempty"`
	// ServiceName is the spans' service.name. Default tokenwarden-proxy.
	// +optional
	// +kubebuilder:validation:MaxLength=128
	ServiceName string `json:"serviceName,omitempty"`
}
