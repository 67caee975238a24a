// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/tokenwarden/tokenwarden/test/fakellm"
	"github.com/tokenwarden/tokenwarden/test/stack"
)

// A fleet whose model gpt-4o has a context window and two upstreams, the stack's fake
// backend first: the proxy process refuses what cannot fit, fails over when the first
// backend fails, and the TokenProxy's status counts the healthy upstreams.
var _ = Describe("The model registry of a fleet", func() {
	It("pre-checks the window, fails over to the second upstream, and shows the open breaker on the TokenProxy", func() {
		prior := st.LLM.Behaviour()
		DeferCleanup(func() { st.LLM.Set(prior) })
		second := fakellm.New()
		backup := httptest.NewServer(second)
		DeferCleanup(backup.Close)

		ns := namespace()
		apply(ns, fmt.Sprintf(`
apiVersion: tokenwarden.io/v1alpha1
kind: TokenProxy
metadata: {name: fleet}
spec:
  replicas: 1
  upstreams:
  - {name: first, url: %q, provider: OpenAI}
  - {name: backup, url: %q}
  models:
  - name: gpt-4o
    contextWindow: 2000
    upstreams: [{upstream: first}, {upstream: backup, providerModel: gpt-4o-2024-08-06}]
`, st.LLMURL, backup.URL)+keyManifest("ana", ""))
		proxies, err := st.SyncProxies(context.Background(), ns, "fleet")
		Expect(err).NotTo(HaveOccurred())
		enforced(ns)
		p := proxies[0]

		By("a prompt that cannot fit the window: 400 before either backend")
		st.LLM.Reset()
		rep := post(p, "ana", `{"model":"gpt-4o","max_tokens":100,"messages":[{"role":"user","content":"`+strings.Repeat("word ", 5000)+`"}]}`)
		Expect(rep.code).To(Equal(400))
		Expect(rep.err.Code).To(Equal("context_length_exceeded"))
		Expect(st.LLM.Requests()).To(BeEmpty())
		Expect(second.Requests()).To(BeEmpty())

		By("the first backend failing: every request served by the second, under its own model name")
		st.LLM.Set(fakellm.Behaviour{Status: 503})
		second.Set(fakellm.Behaviour{InputTokens: 10, OutputTokens: 10})
		for range 5 {
			a := chat(p, "ana", "gpt-4o", 10)
			Expect(a.code).To(Equal(200))
			Expect(a.header.Get("X-Tokenwarden-Upstream")).To(Equal("backup"))
		}
		Expect(string(second.Requests()[0].Body)).To(ContainSubstring(`"model":"gpt-4o-2024-08-06"`))
		Expect(st.LLM.Requests()).To(HaveLen(5))
		Expect(chat(p, "ana", "gpt-4o", 10).code).To(Equal(200))
		Expect(st.LLM.Requests()).To(HaveLen(5), "the first upstream's breaker is open")

		By("the fleet's status counting one healthy upstream of two")
		Eventually(func(g Gomega) {
			out, err := st.Kubectl("get", "tp", "fleet", "-n", ns, "-o", "jsonpath={.status.upstreams} {.status.unhealthyUpstreams[0].name}")
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(out).To(Equal("1/2 first"))
		}, "30s").Should(Succeed())
	})
})

// post sends one chat body to p as key NAME.
func post(p *stack.Proxy, name, body string) answer {
	GinkgoHelper()
	req, err := http.NewRequest("POST", p.URL+"/v1/chat/completions", strings.NewReader(body))
	Expect(err).NotTo(HaveOccurred())
	req.Header.Set("Authorization", "Bearer sk-e2e-"+name)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	Expect(err).NotTo(HaveOccurred())
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	Expect(err).NotTo(HaveOccurred())
	a := answer{code: resp.StatusCode, header: resp.Header}
	if resp.StatusCode != 200 {
		var e struct {
			Error json.RawMessage `json:"error"`
		}
		Expect(json.Unmarshal(b, &e)).To(Succeed(), "%s", b)
		Expect(json.Unmarshal(e.Error, &a.err)).To(Succeed(), "%s", b)
	}
	return a
}
