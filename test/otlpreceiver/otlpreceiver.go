// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

// Package otlpreceiver is a real OTLP trace receiver for tests: the gRPC TraceService,
// or POST /v1/traces over HTTP, keeping every span it is sent.
package otlpreceiver

import (
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
)

// Protocols, as the proxy's observability.tracing.protocol names them.
const (
	GRPC = "grpc"
	HTTP = "http/protobuf"
)

// Receiver keeps the spans exported to it, and the service names of their resources.
type Receiver struct {
	coltracepb.UnimplementedTraceServiceServer
	mu       sync.Mutex
	spans    []*tracepb.Span
	services []string
}

// Cleaner registers what to do when the test ends (testing.T, GinkgoT()).
type Cleaner interface {
	Cleanup(func())
}

// Start starts a receiver for protocol (GRPC or HTTP), stopped when the test ends. It
// returns the endpoint to give an exporter: host:port for gRPC, a base URL for HTTP.
func Start(t Cleaner, protocol string) (*Receiver, string, error) {
	rc := &Receiver{}
	switch protocol {
	case HTTP:
		srv := httptest.NewServer(rc)
		t.Cleanup(srv.Close)
		return rc, srv.URL, nil
	case GRPC:
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, "", err
		}
		gs := grpc.NewServer()
		coltracepb.RegisterTraceServiceServer(gs, rc)
		go func() { _ = gs.Serve(ln) }()
		t.Cleanup(gs.Stop)
		return rc, ln.Addr().String(), nil
	}
	return nil, "", fmt.Errorf("protocol: want %q or %q, got %q", GRPC, HTTP, protocol)
}

// Export implements the OTLP TraceService.
func (rc *Receiver) Export(_ context.Context, req *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	for _, rs := range req.ResourceSpans {
		for _, a := range rs.GetResource().GetAttributes() {
			if a.Key == "service.name" {
				rc.services = append(rc.services, a.Value.GetStringValue())
			}
		}
		for _, ss := range rs.ScopeSpans {
			rc.spans = append(rc.spans, ss.Spans...)
		}
	}
	return &coltracepb.ExportTraceServiceResponse{}, nil
}

// ServeHTTP implements OTLP/HTTP with protobuf bodies.
func (rc *Receiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, err := io.ReadAll(r.Body)
	req := &coltracepb.ExportTraceServiceRequest{}
	if err != nil || r.URL.Path != "/v1/traces" || proto.Unmarshal(b, req) != nil {
		http.Error(w, "not an OTLP trace export", http.StatusBadRequest)
		return
	}
	_, _ = rc.Export(r.Context(), req)
	w.Header().Set("Content-Type", "application/x-protobuf")
	out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
	_, _ = w.Write(out)
}

// Trace returns the spans received of a trace (its id in hex), by name.
func (rc *Receiver) Trace(traceID string) map[string]*tracepb.Span {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	out := map[string]*tracepb.Span{}
	for _, s := range rc.spans {
		if hex.EncodeToString(s.TraceId) == traceID {
			out[s.Name] = s
		}
	}
	return out
}

// Spans returns how many spans were received.
func (rc *Receiver) Spans() int {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return len(rc.spans)
}

// Services returns the service.name of every resource received, one per export.
func (rc *Receiver) Services() []string {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]string(nil), rc.services...)
}

// Attrs returns a span's attributes by key: strings, int64s, bools and float64s.
func Attrs(s *tracepb.Span) map[string]any {
	out := map[string]any{}
	for _, a := range s.Attributes {
		out[a.Key] = value(a.Value)
	}
	return out
}

func value(v *commonpb.AnyValue) any {
	switch x := v.Value.(type) {
	case *commonpb.AnyValue_StringValue:
		return x.StringValue
	case *commonpb.AnyValue_IntValue:
		return x.IntValue
	case *commonpb.AnyValue_BoolValue:
		return x.BoolValue
	case *commonpb.AnyValue_DoubleValue:
		return x.DoubleValue
	}
	return nil
}
