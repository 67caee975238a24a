// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package server_test

import (
	"context"
	"io"
	"log/slog"
	"net"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/grpc"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/proxy/config"
	"github.com/tokenwarden/tokenwarden/proxy/metrics"
	"github.com/tokenwarden/tokenwarden/proxy/server"
	"github.com/tokenwarden/tokenwarden/proxy/telemetry"
)

// discardExporter takes every span and keeps none: the SDK's cost without a wire.
type discardExporter struct{}

func (discardExporter) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error { return nil }
func (discardExporter) Shutdown(context.Context) error                             { return nil }

// discardReceiver is an OTLP/gRPC receiver that drops what it gets.
type discardReceiver struct {
	coltracepb.UnimplementedTraceServiceServer
}

func (discardReceiver) Export(context.Context, *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	return &coltracepb.ExportTraceServiceResponse{}, nil
}

// BenchmarkHandlerObserved is BenchmarkHandler with the access log off, on (written
// to io.Discard), and on with every request traced: spans batched to an exporter that
// drops them, or sent by OTLP/gRPC to a receiver in the same process. -count
// interleaves the cases, so their ratios come from one run.
func BenchmarkHandlerObserved(b *testing.B) {
	backend := benchBackend()
	defer backend.Close()
	off := "observability:\n  access_log: {disabled: true}\n" + benchDoc
	ratio := 1.0
	otlp := func(b *testing.B) *sdktrace.TracerProvider {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		gs := grpc.NewServer()
		coltracepb.RegisterTraceServiceServer(gs, discardReceiver{})
		go func() { _ = gs.Serve(ln) }()
		b.Cleanup(gs.Stop)
		tp, err := telemetry.NewTracerProvider(context.Background(),
			&config.Tracing{Enabled: true, Endpoint: ln.Addr().String(), Insecure: true, SampleRatio: &ratio}, "")
		if err != nil {
			b.Fatal(err)
		}
		return tp
	}
	sdk := func(*testing.B) *sdktrace.TracerProvider {
		return sdktrace.NewTracerProvider(sdktrace.WithBatcher(discardExporter{}))
	}
	for _, c := range []struct {
		name string
		doc  string
		tp   func(*testing.B) *sdktrace.TracerProvider
	}{
		{"log-off", off, nil},
		{"log-on", benchDoc, nil},
		{"log-on-traces-sdk", benchDoc, sdk},
		{"log-on-traces-otlp-grpc", benchDoc, otlp},
	} {
		b.Run(c.name, func(b *testing.B) {
			o := server.Options{AccessLog: io.Discard}
			if c.tp != nil {
				tp := c.tp(b)
				b.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
				o.TracerProvider = tp
			}
			benchHandlerOn(b, newObservedBenchServer(b, backend.URL, c.doc, o))
		})
	}
}

func newObservedBenchServer(b *testing.B, upstream, doc string, o server.Options) *server.Server {
	store := budget.NewMemory(budget.SystemClock{}, 1000000)
	o.Store, o.Metrics = store, metrics.New(prometheus.NewRegistry())
	o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	srv := server.New(o)
	doc = strings.ReplaceAll(strings.ReplaceAll(doc, "UPSTREAM", upstream), "HASH", keyHash("sk-alice"))
	if _, err := srv.Apply([]byte(doc), "bench"); err != nil {
		b.Fatal(err)
	}
	return srv
}
