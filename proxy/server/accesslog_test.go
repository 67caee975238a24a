// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package server_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"net/http/httptest"
	"strings"
	"sync"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/proxy/budget/storetest"
	"github.com/tokenwarden/tokenwarden/proxy/metrics"
	"github.com/tokenwarden/tokenwarden/proxy/server"
	"github.com/tokenwarden/tokenwarden/test/fakellm"
)

// logLines collects the access log's lines; while gate is open (non-nil) every write
// waits for it, as a stuck output would.
type logLines struct {
	mu   sync.Mutex
	buf  bytes.Buffer
	gate chan struct{}
}

func (l *logLines) Write(p []byte) (int, error) {
	l.mu.Lock()
	gate := l.gate
	l.mu.Unlock()
	if gate != nil {
		<-gate
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

// all returns every line written so far, decoded.
func (l *logLines) all() []map[string]any {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []map[string]any
	sc := bufio.NewScanner(bytes.NewReader(l.buf.Bytes()))
	for sc.Scan() {
		var m map[string]any
		Expect(json.Unmarshal(sc.Bytes(), &m)).To(Succeed(), sc.Text())
		out = append(out, m)
	}
	return out
}

// line returns the line of a request id, or nil.
func (l *logLines) line(id string) map[string]any {
	for _, m := range l.all() {
		if m["request_id"] == id {
			return m
		}
	}
	return nil
}

// logged waits for the line of a request id.
func (l *logLines) logged(id string) map[string]any {
	GinkgoHelper()
	Eventually(func() map[string]any { return l.line(id) }).ShouldNot(BeNil(), "the access log line of %s", id)
	return l.line(id)
}

// newObservedHarness is newHarness with the observability options o sets.
func newObservedHarness(doc string, o server.Options) *harness {
	h := &harness{llm: fakellm.New(), clock: storetest.NewClock(), reg: prometheus.NewRegistry()}
	h.backend = httptest.NewServer(h.llm)
	DeferCleanup(h.backend.Close)
	h.store = budget.NewMemory(h.clock, 1000)
	h.m = metrics.New(h.reg)
	o.Store, o.Memory, o.Metrics, o.Clock = h.store, h.store, h.m, h.clock
	o.Logger = slog.New(slog.NewTextHandler(GinkgoWriter, nil))
	h.srv = server.New(o)
	_, err := h.srv.Apply([]byte(h.render(doc)), "test")
	Expect(err).NotTo(HaveOccurred())
	h.front = httptest.NewServer(h.srv)
	DeferCleanup(h.front.Close)
	return h
}

const loggedDoc = keysDoc + `  limits:
    per_api_key: {tokens_per_minute: 1000}
`

// id is the request id the proxy returned.
func id(r reply) string {
	GinkgoHelper()
	v := r.header.Get(server.RequestIDHeader)
	Expect(v).NotTo(BeEmpty(), "the response carries its request id")
	return v
}

var _ = Describe("The access log", func() {
	var out *logLines
	BeforeEach(func() { out = &logLines{} })

	It("tells an admitted request's identity, decision, usage, settlement, latency and bytes", func() {
		h := newObservedHarness(loggedDoc, server.Options{AccessLog: out})
		h.llm.Set(fakellm.Behaviour{InputTokens: 100, OutputTokens: 30, CachedTokens: 40})
		r := h.chat("sk-alice", 50)
		Expect(r.code).To(Equal(200))
		l := out.logged(id(r))
		Expect(l).To(HaveKeyWithValue("msg", "request"))
		Expect(l).To(HaveKeyWithValue("route", "/v1/chat/completions"))
		Expect(l).To(HaveKeyWithValue("method", "POST"))
		Expect(l).To(HaveKeyWithValue("model", "gpt-4o"))
		Expect(l).To(HaveKeyWithValue("api_key", "alice"))
		Expect(l).To(HaveKeyWithValue("user", "alice"))
		Expect(l).To(HaveKeyWithValue("team", "research"))
		Expect(l).To(HaveKeyWithValue("client", "127.0.0.1"))
		Expect(l).To(HaveKeyWithValue("status", 200.0))
		Expect(l).To(HaveKeyWithValue("decision", "admitted"))
		Expect(l).To(HaveKeyWithValue("tokens_reserved", chatEstimate(50)))
		Expect(l).To(HaveKeyWithValue("usage", map[string]any{"input": 100.0, "output": 30.0, "cached": 40.0}))
		Expect(l).To(HaveKeyWithValue("settlement", map[string]any{"outcome": "settled", "refund": 0.0, "overage": 130 - chatEstimate(50)}))
		Expect(l).To(HaveKeyWithValue("upstream", "default"))
		Expect(l).To(HaveKey("upstream_latency_ms"))
		Expect(l).To(HaveKey("latency_ms"))
		Expect(l["latency_ms"]).To(BeNumerically(">=", l["upstream_latency_ms"]))
		Expect(l).To(HaveKeyWithValue("bytes_in", BeNumerically(">", 50)))
		Expect(l).To(HaveKeyWithValue("bytes_out", float64(len(r.body))))
		Expect(l).NotTo(HaveKey("refusal"))
		Expect(strings.Join(mapKeys(l), " ")).NotTo(ContainSubstring("sk-alice"))
		Expect(out.buf.String()).NotTo(ContainSubstring("sk-alice"), "no key material")
	})

	It("tells a refused request's dimension and period, and that nothing was forwarded", func() {
		h := newObservedHarness(loggedDoc, server.Options{AccessLog: out})
		r := h.chat("sk-alice", 2000)
		Expect(r.code).To(Equal(429))
		l := out.logged(id(r))
		Expect(l).To(HaveKeyWithValue("status", 429.0))
		Expect(l).To(HaveKeyWithValue("decision", "refused"))
		Expect(l).To(HaveKeyWithValue("error", "rate_limit_exceeded"))
		Expect(l["refusal"]).To(And(HaveKeyWithValue("limit", "token_budget"), HaveKeyWithValue("dimension", "api_key"),
			HaveKeyWithValue("period", "minute"), HaveKeyWithValue("retry_after_seconds", BeNumerically(">", 0)),
			HaveKeyWithValue("larger_than_budget", true)))
		Expect(l).NotTo(HaveKey("tokens_reserved"))
		Expect(l).NotTo(HaveKey("settlement"))
		Expect(l).NotTo(HaveKey("upstream_latency_ms"))
		Expect(l).NotTo(HaveKey("upstream"), "no upstream was sent the request")
		Expect(h.llm.Requests()).To(BeEmpty())
	})

	It("tells that a bypass key is exempt", func() {
		h := newObservedHarness(loggedDoc, server.Options{AccessLog: out})
		r := h.chat("sk-root", 5000)
		Expect(r.code).To(Equal(200))
		Expect(out.logged(id(r))).To(HaveKeyWithValue("decision", "exempt"))
	})

	It("tells that a request was admitted failing open when its bucket could not be made", func() {
		h := newObservedHarness(keysDoc+`  max_buckets: 1
  limits:
    per_api_key: {tokens_per_minute: 1000}
`, server.Options{AccessLog: out})
		first := h.chat("sk-alice", 10)
		Expect(out.logged(id(first))).To(HaveKeyWithValue("decision", "admitted"))
		r := h.chat("sk-bob", 10)
		Expect(r.code).To(Equal(200))
		Expect(out.logged(id(r))).To(HaveKeyWithValue("decision", "failed_open"), "bob's bucket did not fit the full map")
	})

	It("tells a stream's usage as the stream reported it, and every byte sent", func() {
		h := newObservedHarness(loggedDoc, server.Options{AccessLog: out})
		h.llm.Set(fakellm.Behaviour{InputTokens: 100, OutputTokens: 7})
		r := h.do("POST", "/v1/chat/completions", "sk-alice",
			`{"model":"m","stream":true,"stream_options":{"include_usage":true},"max_tokens":500,"messages":[{"role":"user","content":"hi"}]}`)
		Expect(r.code).To(Equal(200))
		l := out.logged(id(r))
		Expect(l).To(HaveKeyWithValue("decision", "admitted"))
		Expect(l).To(HaveKeyWithValue("usage", map[string]any{"input": 100.0, "output": 7.0, "cached": 0.0}))
		Expect(l).To(HaveKeyWithValue("settlement", HaveKeyWithValue("outcome", "settled")))
		Expect(l["settlement"]).To(HaveKeyWithValue("refund", l["tokens_reserved"].(float64)-107))
		Expect(l["settlement"]).NotTo(HaveKey("cut"))
		Expect(l).To(HaveKeyWithValue("bytes_out", float64(len(r.body))))
	})

	It("tells a cut stream's counted usage and that it was cut", func() {
		h := newObservedHarness(loggedDoc, server.Options{AccessLog: out})
		h.llm.Set(fakellm.Behaviour{InputTokens: 100, OutputTokens: 50, CutAfter: 3})
		resp := h.post("/v1/chat/completions", "sk-alice", `{"model":"m","stream":true,"max_tokens":500,"messages":[{"role":"user","content":"hi"}]}`)
		_, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
		rid := resp.Header.Get(server.RequestIDHeader)
		l := out.logged(rid)
		// The input estimate (20) and three deltas of two tokens, against 520 reserved.
		Expect(l).To(HaveKeyWithValue("usage", map[string]any{"input": 20.0, "output": 6.0, "cached": 0.0}))
		Expect(l).To(HaveKeyWithValue("settlement", map[string]any{"outcome": "settled", "cut": true, "refund": 494.0, "overage": 0.0}))
	})

	It("returns the request id, forwards it upstream, and keeps a sane one the client sent", func() {
		h := newObservedHarness(loggedDoc, server.Options{AccessLog: out})
		r := h.chat("sk-alice", 10)
		Expect(id(r)).To(MatchRegexp(`^[0-9a-f]{32}$`))
		Expect(h.llm.Requests()[0].Header.Get("X-Request-Id")).To(Equal(id(r)))

		r = h.doAt(h.front.URL, "POST", "/v1/chat/completions", "sk-alice", `{"model":"m","max_tokens":10}`, "X-Request-Id", "client-42")
		Expect(id(r)).To(Equal("client-42"))
		Expect(h.llm.Requests()[len(h.llm.Requests())-1].Header.Get("X-Request-Id")).To(Equal("client-42"))
		Expect(out.logged("client-42")).To(HaveKeyWithValue("status", 200.0))

		r = h.doAt(h.front.URL, "POST", "/v1/chat/completions", "sk-alice", `{"model":"m","max_tokens":10}`,
			server.RequestIDHeader, `a "quoted" id`)
		Expect(id(r)).To(MatchRegexp(`^[0-9a-f]{32}$`), "an id with spaces or quotes is replaced")
	})

	It("keeps the upstream's own request id for the client and in the log", func() {
		h := newObservedHarness(loggedDoc, server.Options{AccessLog: out})
		h.llm.Set(fakellm.Behaviour{InputTokens: 1, OutputTokens: 1, Header: map[string]string{"X-Request-Id": "req_provider"}})
		r := h.chat("sk-alice", 10)
		Expect(r.header.Get("X-Request-Id")).To(Equal("req_provider"))
		Expect(out.logged(id(r))).To(HaveKeyWithValue("upstream_request_id", "req_provider"))
	})

	It("samples answered requests but logs every refusal", func() {
		h := newObservedHarness(`
observability:
  access_log: {sample_ratio: 0}
`+loggedDoc, server.Options{AccessLog: out})
		ok := h.chat("sk-alice", 10)
		Expect(ok.code).To(Equal(200))
		no := h.chat("sk-alice", 2000)
		Expect(no.code).To(Equal(429))
		out.logged(id(no))
		// Lines are written in order: the answered one would be there by now.
		Expect(out.line(id(ok))).To(BeNil())
	})

	It("writes only the fields selected", func() {
		h := newObservedHarness(`
observability:
  access_log: {fields: [status, decision]}
`+loggedDoc, server.Options{AccessLog: out})
		r := h.chat("sk-alice", 10)
		Expect(mapKeys(out.logged(id(r)))).To(ConsistOf("time", "level", "msg", "request_id", "status", "decision"))
	})

	It("is turned off and on by a reload", func() {
		h := newObservedHarness(`
observability:
  access_log: {disabled: true}
`+loggedDoc, server.Options{AccessLog: out})
		off := h.chat("sk-alice", 10)
		Expect(h.apply(loggedDoc)).To(Succeed())
		on := h.chat("sk-alice", 10)
		out.logged(id(on))
		Expect(out.line(id(off))).To(BeNil())
	})

	It("never holds a request when its output is stuck: lines beyond the buffer are dropped and counted", func() {
		out.gate = make(chan struct{})
		h := newObservedHarness(loggedDoc, server.Options{AccessLog: out, AccessLogBuffer: 1})
		for range 5 {
			Expect(h.chat("sk-alice", 10).code).To(Equal(200))
		}
		lines := h.m.Observability.AccessLogLines
		// One line is in the stuck write, at most one waits in the buffer.
		Expect(counter(lines.WithLabelValues("dropped"))).To(BeNumerically(">=", 3))
		out.mu.Lock()
		close(out.gate)
		out.gate = nil
		out.mu.Unlock()
		Eventually(func() float64 {
			return counter(lines.WithLabelValues("dropped")) + counter(lines.WithLabelValues("written"))
		}).Should(Equal(5.0))
	})
})

func mapKeys(m map[string]any) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}
