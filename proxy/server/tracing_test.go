// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package server_test

import (
	"context"
	"encoding/hex"
	"fmt"
	"net/url"
	"strconv"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"

	"github.com/tokenwarden/tokenwarden/proxy/config"
	"github.com/tokenwarden/tokenwarden/proxy/server"
	"github.com/tokenwarden/tokenwarden/proxy/telemetry"
	"github.com/tokenwarden/tokenwarden/test/fakellm"
	"github.com/tokenwarden/tokenwarden/test/otlpreceiver"
)

// startReceiver starts a receiver for protocol and returns the endpoint to give the
// proxy.
func startReceiver(protocol string) (*otlpreceiver.Receiver, string) {
	GinkgoHelper()
	rc, endpoint, err := otlpreceiver.Start(GinkgoT(), protocol)
	Expect(err).NotTo(HaveOccurred())
	return rc, endpoint
}

var attrs = otlpreceiver.Attrs

const (
	clientTrace  = "4bf92f3577b34da6a3ce929d0e0e4736"
	clientParent = "00f067aa0ba902b7"
)

var _ = Describe("Traces", func() {
	DescribeTable("reach a real OTLP receiver with the GenAI attributes, under the client's traceparent",
		func(protocol string) {
			rc, endpoint := startReceiver(protocol)
			tp, err := telemetry.NewTracerProvider(context.Background(),
				&config.Tracing{Enabled: true, Protocol: protocol, Endpoint: endpoint, Insecure: true, ServiceName: "proxy-under-test"}, "")
			Expect(err).NotTo(HaveOccurred())
			DeferCleanup(tp.Shutdown)
			out := &logLines{}
			h := newObservedHarness(loggedDoc, server.Options{AccessLog: out, TracerProvider: tp})
			h.llm.Set(fakellm.Behaviour{InputTokens: 100, OutputTokens: 30, CachedTokens: 40})

			r := h.doAt(h.front.URL, "POST", "/v1/chat/completions", "sk-alice",
				`{"model":"gpt-4o","max_tokens":50,"messages":[{"role":"user","content":"hello there"}]}`,
				"Traceparent", "00-"+clientTrace+"-"+clientParent+"-01")
			Expect(r.code).To(Equal(200))
			Expect(tp.ForceFlush(context.Background())).To(Succeed())

			var spans map[string]*tracepb.Span
			Eventually(func() map[string]*tracepb.Span { spans = rc.Trace(clientTrace); return spans }).
				Should(HaveLen(3), "the server span, the admission span and the upstream span")
			Expect(rc.Services()).To(ContainElement("proxy-under-test"))
			for name, s := range spans {
				for k, v := range attrs(s) {
					Expect(fmt.Sprint(v)).NotTo(ContainSubstring("sk-alice"), "span %q attribute %s: no key material, keys by name", name, k)
				}
			}

			srv := spans["chat gpt-4o"]
			Expect(srv).NotTo(BeNil(), "the server span is named for the operation and the model")
			Expect(srv.Kind).To(Equal(tracepb.Span_SPAN_KIND_SERVER))
			Expect(hex.EncodeToString(srv.ParentSpanId)).To(Equal(clientParent), "the client's span is the parent")
			Expect(attrs(srv)).To(And(
				HaveKeyWithValue("gen_ai.operation.name", "chat"),
				HaveKeyWithValue("gen_ai.provider.name", "openai"),
				HaveKeyWithValue("gen_ai.request.model", "gpt-4o"),
				HaveKeyWithValue("gen_ai.request.max_tokens", int64(50)),
				HaveKeyWithValue("gen_ai.usage.input_tokens", int64(100)),
				HaveKeyWithValue("gen_ai.usage.output_tokens", int64(30)),
				HaveKeyWithValue("gen_ai.usage.cache_read.input_tokens", int64(40)),
				HaveKeyWithValue("http.response.status_code", int64(200)),
				HaveKeyWithValue("tokenwarden.decision", "admitted"),
				HaveKeyWithValue("tokenwarden.api_key", "alice"),
				HaveKeyWithValue("tokenwarden.request_id", id(r)),
				HaveKeyWithValue("tokenwarden.settlement", "settled"),
			))

			adm := spans["tokenwarden.admission"]
			Expect(adm).NotTo(BeNil())
			Expect(adm.ParentSpanId).To(Equal(srv.SpanId))
			Expect(attrs(adm)).To(HaveKeyWithValue("tokenwarden.decision", "admitted"))

			up := spans["tokenwarden.upstream default"]
			Expect(up).NotTo(BeNil())
			Expect(up.Kind).To(Equal(tracepb.Span_SPAN_KIND_CLIENT))
			backend, err := url.Parse(h.backend.URL)
			Expect(err).NotTo(HaveOccurred())
			port, err := strconv.Atoi(backend.Port())
			Expect(err).NotTo(HaveOccurred())
			Expect(attrs(up)).To(And(
				HaveKeyWithValue("tokenwarden.upstream", "default"),
				HaveKeyWithValue("server.address", backend.Hostname()),
				HaveKeyWithValue("server.port", int64(port)),
			), "the host in server.address, the port in server.port")
			Expect(up.ParentSpanId).To(Equal(srv.SpanId))
			Expect(h.llm.Requests()[0].Header.Get("Traceparent")).To(
				Equal("00-"+clientTrace+"-"+hex.EncodeToString(up.SpanId)+"-01"), "the upstream call is the upstream's parent")

			Expect(out.logged(id(r))).To(HaveKeyWithValue("trace_id", clientTrace))
			for _, sp := range spans {
				Expect(time.Unix(0, int64(sp.StartTimeUnixNano)).UTC()).To(Equal(h.clock.Now()), "%s is timed on the server's clock", sp.Name)
			}
		},
		Entry("over OTLP/gRPC", config.TracingGRPC),
		Entry("over OTLP/HTTP", config.TracingHTTP),
	)

	It("export nothing for a request not sampled, and still pass the trace context upstream", func() {
		rc, endpoint := startReceiver(config.TracingGRPC)
		none := 0.0
		tp, err := telemetry.NewTracerProvider(context.Background(),
			&config.Tracing{Enabled: true, Endpoint: endpoint, Insecure: true, SampleRatio: &none}, "")
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(tp.Shutdown)
		out := &logLines{}
		h := newObservedHarness(loggedDoc, server.Options{AccessLog: out, TracerProvider: tp})
		r := h.chat("sk-alice", 10)
		Expect(r.code).To(Equal(200))
		Expect(tp.ForceFlush(context.Background())).To(Succeed())
		Expect(out.logged(id(r))).NotTo(HaveKey("trace_id"), "no trace to look for")
		Expect(rc.Spans()).To(BeZero())
		Expect(h.llm.Requests()[0].Header.Get("Traceparent")).To(MatchRegexp(`^00-[0-9a-f]{32}-[0-9a-f]{16}-00$`))
	})

	It("name what refused a request, with no upstream span", func() {
		rc, endpoint := startReceiver(config.TracingGRPC)
		tp, err := telemetry.NewTracerProvider(context.Background(),
			&config.Tracing{Enabled: true, Endpoint: endpoint, Insecure: true}, "")
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(tp.Shutdown)
		h := newObservedHarness(loggedDoc, server.Options{AccessLog: &logLines{}, TracerProvider: tp})
		r := h.doAt(h.front.URL, "POST", "/v1/messages", "sk-alice",
			`{"model":"claude","max_tokens":5000,"messages":[{"role":"user","content":"hi"}]}`,
			"Traceparent", "00-"+clientTrace+"-"+clientParent+"-01")
		Expect(r.code).To(Equal(429))
		Expect(tp.ForceFlush(context.Background())).To(Succeed())
		var spans map[string]*tracepb.Span
		Eventually(func() map[string]*tracepb.Span { spans = rc.Trace(clientTrace); return spans }).Should(HaveLen(2))
		Expect(spans).To(HaveKey("tokenwarden.admission"))
		Expect(attrs(spans["chat claude"])).To(And(
			HaveKeyWithValue("gen_ai.provider.name", "anthropic"),
			HaveKeyWithValue("tokenwarden.decision", "refused"),
			HaveKeyWithValue("tokenwarden.refusal.limit", "token_budget"),
			HaveKeyWithValue("tokenwarden.refusal.dimension", "api_key"),
			HaveKeyWithValue("tokenwarden.refusal.period", "minute"),
			HaveKeyWithValue("http.response.status_code", int64(429)),
			Not(HaveKey("gen_ai.usage.input_tokens")),
		))
	})

	It("say how the response cache answered, and a hit's age, as its header and access log line do", func() {
		rc, endpoint := startReceiver(config.TracingGRPC)
		tp, err := telemetry.NewTracerProvider(context.Background(),
			&config.Tracing{Enabled: true, Endpoint: endpoint, Insecure: true}, "")
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(tp.Shutdown)
		out := &logLines{}
		h := newObservedHarness(keysDoc+"  limits:\n    per_api_key: {tokens_per_minute: 6000}\ncache: {storage: memory}\n",
			server.Options{AccessLog: out, TracerProvider: tp})
		send := func(trace string) reply {
			return h.doAt(h.front.URL, "POST", "/v1/chat/completions", "sk-alice", chatBody, "Traceparent", "00-"+trace+"-"+clientParent+"-01")
		}
		const missTrace, hitTrace = "4bf92f3577b34da6a3ce929d0e0e4701", "4bf92f3577b34da6a3ce929d0e0e4702"
		miss := send(missTrace)
		Expect(miss.header.Get("X-Tokenwarden-Cache")).To(Equal("miss"))
		Expect(out.logged(id(miss))).To(And(HaveKeyWithValue("cache", "miss"), Not(HaveKey("cache_age_seconds"))))
		h.clock.Advance(7 * time.Second)
		hit := send(hitTrace)
		Expect(hit.header.Get("X-Tokenwarden-Cache")).To(Equal("hit"))
		Expect(hit.header.Get("Age")).To(Equal("7"))
		Expect(out.logged(id(hit))).To(And(HaveKeyWithValue("cache", "hit"), HaveKeyWithValue("cache_age_seconds", 7.0)))
		Expect(tp.ForceFlush(context.Background())).To(Succeed())

		var spans map[string]*tracepb.Span
		Eventually(func() map[string]*tracepb.Span { spans = rc.Trace(missTrace); return spans }).Should(HaveKey("chat gpt-4o"))
		Expect(attrs(spans["chat gpt-4o"])).To(And(HaveKeyWithValue("tokenwarden.cache", "miss"), Not(HaveKey("tokenwarden.cache.age_seconds"))))
		Eventually(func() map[string]*tracepb.Span { spans = rc.Trace(hitTrace); return spans }).Should(HaveKey("chat gpt-4o"))
		Expect(spans).NotTo(HaveKey("tokenwarden.upstream default"), "a hit calls no upstream")
		Expect(attrs(spans["chat gpt-4o"])).To(And(
			HaveKeyWithValue("tokenwarden.cache", "hit"),
			HaveKeyWithValue("tokenwarden.cache.age_seconds", int64(7)),
			HaveKeyWithValue("tokenwarden.settlement", "released"),
		))
	})
})
