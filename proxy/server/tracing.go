// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package server

import (
	"context"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/tokenwarden/tokenwarden/proxy/accesslog"
	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/proxy/metrics"
	"github.com/tokenwarden/tokenwarden/proxy/refusal"
)

// tracerName is the instrumentation scope of the proxy's spans.
const tracerName = "github.com/tokenwarden/tokenwarden/proxy/server"

// tracing makes a request's spans: a server span, with children for admission and
// the upstream call. W3C trace context is taken from the client and sent upstream.
//
// The spans are timed on the server's clock. On the system clock the SDK's own
// timestamps are that clock's readings, and cost no allocation; on another clock
// (stamp) each span is given the request's own timestamps.
type tracing struct {
	tracer trace.Tracer
	prop   propagation.TraceContext
	stamp  bool
}

func newTracing(tp trace.TracerProvider, clock budget.Clock) *tracing {
	if tp == nil {
		return nil
	}
	_, system := clock.(budget.SystemClock)
	return &tracing{tracer: tp.Tracer(tracerName), stamp: !system}
}

// begin starts a span at the time at.
func (t *tracing) begin(ctx context.Context, name string, at time.Time, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	if t.stamp {
		opts = append(opts, trace.WithTimestamp(at))
	}
	return t.tracer.Start(ctx, name, opts...)
}

// finish ends a span at the time at.
func (t *tracing) finish(sp trace.Span, at time.Time) {
	if t.stamp {
		sp.End(trace.WithTimestamp(at))
		return
	}
	sp.End()
}

// start begins the server span, the child of the client's traceparent when it sent
// one.
func (t *tracing) start(ex *exchange, r *http.Request) *http.Request {
	ctx := t.prop.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
	ctx, ex.span = t.begin(ctx, "tokenwarden "+ex.route.name, ex.rec.Start, trace.WithSpanKind(trace.SpanKindServer))
	if sc := ex.span.SpanContext(); sc.IsSampled() {
		ex.rec.TraceID = sc.TraceID()
	}
	return r.WithContext(ctx)
}

// admission starts the admission span at now; the store's round trip runs inside it.
func (t *tracing) admission(ctx context.Context, now time.Time) (context.Context, trace.Span) {
	return t.begin(ctx, "tokenwarden.admission", now, trace.WithSpanKind(trace.SpanKindInternal))
}

// admitted ends the admission span at now with its outcome.
func (t *tracing) admitted(sp trace.Span, ex *exchange, err error, now time.Time) {
	if err != nil {
		sp.RecordError(err)
		sp.SetStatus(codes.Error, "the budget store could not decide")
	} else {
		sp.SetAttributes(attribute.String("tokenwarden.decision", ex.rec.Decision.String()),
			attribute.Int64("tokenwarden.tokens_reserved", ex.rec.Reserved))
	}
	t.finish(sp, now)
}

// upstream starts the span of the upstream call at the hand-off at; its context goes
// upstream as the traceparent. server.address is the upstream's host and server.port
// its port, as the semantic conventions put them.
func (t *tracing) upstream(ctx context.Context, ex *exchange, at time.Time) context.Context {
	u := ex.upstream.Target
	ctx, ex.upSpan = t.begin(ctx, "tokenwarden.upstream "+ex.upstream.Name, at, trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(attribute.String("tokenwarden.upstream", ex.upstream.Name),
			attribute.String("server.address", u.Hostname()), attribute.Int("server.port", port(u))))
	return ctx
}

// port is a URL's port: the one it names, or its scheme's.
func port(u *url.URL) int {
	if p, err := strconv.Atoi(u.Port()); err == nil {
		return p
	}
	if u.Scheme == "https" {
		return 443
	}
	return 80
}

// inject writes the upstream span's trace context into the upstream request.
func (t *tracing) inject(ctx context.Context, h http.Header) {
	t.prop.Inject(ctx, propagation.HeaderCarrier(h))
}

// operation is the GenAI operation of a route.
func operation(route string) string {
	switch route {
	case "/v1/completions":
		return "text_completion"
	case "other":
		return ""
	}
	return "chat"
}

// end sets the request's attributes, in the GenAI semantic conventions where they
// have a name, and ends its spans.
func (t *tracing) end(ex *exchange) {
	rec := &ex.rec
	if ex.upSpan != nil {
		ex.upSpan.SetAttributes(attribute.Int("http.response.status_code", rec.Status))
		if rec.UpstreamHeaders.IsZero() {
			ex.upSpan.SetStatus(codes.Error, "the upstream did not answer")
		}
		t.finish(ex.upSpan, rec.Finished)
	}
	sp := ex.span
	if !sp.IsRecording() {
		// Not sampled: nothing to describe.
		sp.End()
		return
	}
	attrs := make([]attribute.KeyValue, 0, 20)
	attrs = append(attrs,
		attribute.String("http.request.method", rec.Method),
		attribute.String("http.route", rec.Route),
		attribute.Int("http.response.status_code", rec.Status),
		attribute.String("tokenwarden.request_id", rec.RequestID),
		attribute.String("tokenwarden.decision", rec.Decision.String()))
	op := operation(rec.Route)
	if op != "" {
		provider := "openai"
		if ex.route.family == refusal.Anthropic {
			provider = "anthropic"
		}
		attrs = append(attrs, attribute.String("gen_ai.operation.name", op), attribute.String("gen_ai.provider.name", provider))
	}
	if rec.Model != "" {
		attrs = append(attrs, attribute.String("gen_ai.request.model", rec.Model))
		if op != "" {
			sp.SetName(op + " " + rec.Model)
		}
	}
	if ex.est.Output > 0 {
		attrs = append(attrs, attribute.Int64("gen_ai.request.max_tokens", ex.est.Output))
	}
	if ex.est.Stream {
		attrs = append(attrs, attribute.Bool("tokenwarden.stream", true))
	}
	if rec.APIKey != "" {
		attrs = append(attrs, attribute.String("tokenwarden.api_key", rec.APIKey))
	}
	if rec.User != "" {
		attrs = append(attrs, attribute.String("user.id", rec.User))
	}
	if rec.Team != "" {
		attrs = append(attrs, attribute.String("tokenwarden.team", rec.Team))
	}
	if rec.Reserved > 0 {
		attrs = append(attrs, attribute.Int64("tokenwarden.tokens_reserved", rec.Reserved))
	}
	if rec.Settlement != accesslog.NotSettled {
		attrs = append(attrs, attribute.String("tokenwarden.settlement", rec.Settlement.String()))
		if rec.Settlement == accesslog.SettledUsage {
			attrs = append(attrs, attribute.Int64("gen_ai.usage.input_tokens", rec.Used.Input),
				attribute.Int64("gen_ai.usage.output_tokens", rec.Used.Output))
			if rec.Used.Cached > 0 {
				attrs = append(attrs, attribute.Int64("gen_ai.usage.cache_read.input_tokens", rec.Used.Cached))
			}
		}
	}
	if rec.Decision == accesslog.Refused {
		attrs = append(attrs, refusalAttrs(rec)...)
	}
	if rec.Cache != "" {
		attrs = append(attrs, attribute.String("tokenwarden.cache", rec.Cache))
		if rec.Cache == metrics.CacheHit {
			attrs = append(attrs, attribute.Int64("tokenwarden.cache.age_seconds", rec.CacheAge))
		}
	}
	if rec.ErrCode != "" {
		attrs = append(attrs, attribute.String("error.type", rec.ErrCode))
	}
	sp.SetAttributes(attrs...)
	if rec.Status >= 500 {
		sp.SetStatus(codes.Error, rec.ErrCode)
	}
	t.finish(sp, rec.Finished)
}

// refusalAttrs name what refused a request, never a shared rule's name.
func refusalAttrs(rec *accesslog.Record) []attribute.KeyValue {
	r := rec.Refusal
	if rec.LedgerFull {
		return []attribute.KeyValue{attribute.String("tokenwarden.refusal.limit", "ledger")}
	}
	if rec.Queue || r == nil {
		return []attribute.KeyValue{attribute.String("tokenwarden.refusal.limit", "queue")}
	}
	out := []attribute.KeyValue{attribute.String("tokenwarden.refusal.dimension", r.Dimension.String())}
	switch {
	case r.Rule != "":
		out = append(out, attribute.String("tokenwarden.refusal.limit", "rule"), attribute.String("tokenwarden.refusal.window", r.Window))
		if r.Scoped {
			out = append(out, attribute.String("tokenwarden.refusal.rule", r.Rule))
		}
	case r.Requests:
		out = append(out, attribute.String("tokenwarden.refusal.limit", "requests"))
	default:
		out = append(out, attribute.String("tokenwarden.refusal.limit", "token_budget"),
			attribute.String("tokenwarden.refusal.period", r.Period.String()))
	}
	return out
}
