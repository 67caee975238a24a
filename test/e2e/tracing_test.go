// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"context"
	"encoding/hex"
	"fmt"
	"net/http"
	"os"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"

	"github.com/tokenwarden/tokenwarden/test/fakellm"
	"github.com/tokenwarden/tokenwarden/test/otlpreceiver"
)

var _ = Describe("Traces of a fleet", func() {
	const (
		clientTrace  = "4bf92f3577b34da6a3ce929d0e0e4736"
		clientParent = "00f067aa0ba902b7"
	)

	It("reach the collector its TokenProxy's spec.observability names, under the client's traceparent", func() {
		rc, endpoint, err := otlpreceiver.Start(GinkgoT(), otlpreceiver.GRPC)
		Expect(err).NotTo(HaveOccurred())
		ns := namespace()
		apply(ns, fmt.Sprintf(`
apiVersion: tokenwarden.io/v1alpha1
kind: TokenProxy
metadata: {name: fleet}
spec:
  upstreams: [{name: fake, url: %q}]
  storage: {type: Memory}
  observability:
    tracing: {enabled: true, protocol: grpc, endpoint: "http://%s", serviceName: traced-fleet}
`, st.LLMURL, endpoint)+keyManifest("alice", ""))
		proxies, err := st.SyncProxies(context.Background(), ns, "fleet")
		Expect(err).NotTo(HaveOccurred())
		enforced(ns)
		st.LLM.Set(fakellm.Behaviour{InputTokens: 100, OutputTokens: 30})

		req, err := http.NewRequest("POST", proxies[0].URL+"/v1/chat/completions",
			strings.NewReader(`{"model":"gpt-4o","max_tokens":50,"messages":[{"role":"user","content":"hello there"}]}`))
		Expect(err).NotTo(HaveOccurred())
		req.Header.Set("Authorization", "Bearer sk-e2e-alice")
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Traceparent", "00-"+clientTrace+"-"+clientParent+"-01")
		resp, err := http.DefaultClient.Do(req)
		Expect(err).NotTo(HaveOccurred())
		resp.Body.Close()
		Expect(resp.StatusCode).To(Equal(http.StatusOK))
		id := resp.Header.Get("X-Tokenwarden-Request-Id")

		// The batch exporter sends within its 5 s delay.
		var srv *tracepb.Span
		Eventually(func() *tracepb.Span { srv = rc.Trace(clientTrace)["chat gpt-4o"]; return srv }).ShouldNot(BeNil(),
			"the server span of the request")
		Expect(srv.Kind).To(Equal(tracepb.Span_SPAN_KIND_SERVER))
		Expect(hex.EncodeToString(srv.ParentSpanId)).To(Equal(clientParent), "the client's span is the parent")
		Expect(otlpreceiver.Attrs(srv)).To(And(
			HaveKeyWithValue("gen_ai.operation.name", "chat"),
			HaveKeyWithValue("gen_ai.request.model", "gpt-4o"),
			HaveKeyWithValue("gen_ai.usage.input_tokens", int64(100)),
			HaveKeyWithValue("gen_ai.usage.output_tokens", int64(30)),
			HaveKeyWithValue("tokenwarden.api_key", "alice"),
			HaveKeyWithValue("tokenwarden.request_id", id),
		))
		Expect(rc.Services()).To(ContainElement("traced-fleet"))

		// The proxy's access log line names the trace.
		Eventually(func() string {
			b, _ := os.ReadFile(proxies[0].LogPath)
			for _, l := range strings.Split(string(b), "\n") {
				if strings.Contains(l, `"request_id":"`+id+`"`) {
					return l
				}
			}
			return ""
		}).Should(ContainSubstring(`"trace_id":"` + clientTrace + `"`))
	})
})
