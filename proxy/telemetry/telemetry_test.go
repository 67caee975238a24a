// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package telemetry_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/tokenwarden/tokenwarden/proxy/config"
	"github.com/tokenwarden/tokenwarden/proxy/telemetry"
)

// TestEnvironment: what the tracing block leaves unset comes from the OTEL_*
// environment (endpoint, protocol, service name), and OTEL_SDK_DISABLED turns tracing
// off. The spans go to a real OTLP/HTTP receiver.
func TestEnvironment(t *testing.T) {
	var mu sync.Mutex
	var services []string
	var spans int
	rcv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		req := &coltracepb.ExportTraceServiceRequest{}
		if r.URL.Path != "/v1/traces" || proto.Unmarshal(b, req) != nil {
			http.Error(w, "not an OTLP trace export", http.StatusBadRequest)
			return
		}
		mu.Lock()
		defer mu.Unlock()
		for _, rs := range req.ResourceSpans {
			for _, a := range rs.GetResource().GetAttributes() {
				if a.Key == "service.name" {
					services = append(services, a.Value.GetStringValue())
				}
			}
			for _, ss := range rs.ScopeSpans {
				spans += len(ss.Spans)
			}
		}
		out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		_, _ = w.Write(out)
	}))
	defer rcv.Close()

	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", rcv.URL)
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
	t.Setenv("OTEL_SERVICE_NAME", "from-env")
	tr := &config.Tracing{Enabled: true}
	if !telemetry.Enabled(tr) {
		t.Fatal("enabled: true must enable tracing")
	}
	if p := telemetry.Protocol(tr); p != config.TracingHTTP {
		t.Fatalf("protocol from OTEL_EXPORTER_OTLP_PROTOCOL: got %q", p)
	}
	tp, err := telemetry.NewTracerProvider(context.Background(), tr, "")
	if err != nil {
		t.Fatal(err)
	}
	_, sp := tp.Tracer("test").Start(context.Background(), "one")
	sp.End()
	if err := tp.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	if spans != 1 || len(services) == 0 || services[0] != "from-env" {
		t.Errorf("want one span of service from-env at the receiver the environment names, got %d spans of %v", spans, services)
	}
	mu.Unlock()

	t.Setenv("OTEL_SDK_DISABLED", "true")
	if telemetry.Enabled(tr) {
		t.Error("OTEL_SDK_DISABLED=true turns tracing off")
	}
	if _, err := telemetry.NewTracerProvider(context.Background(), &config.Tracing{Enabled: true, Protocol: "thrift"}, ""); err == nil {
		t.Error("an unknown protocol is refused")
	}
}
