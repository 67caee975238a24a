// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package server_test

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/proxy/metrics"
	"github.com/tokenwarden/tokenwarden/proxy/server"
	"github.com/tokenwarden/tokenwarden/test/fakellm"
	"github.com/tokenwarden/tokenwarden/test/redisserver"
)

// otherProxy starts one more proxy in front of h's backend, on a store of its own,
// and returns its URL and metrics.
func otherProxy(h *harness, doc string) (string, *metrics.Metrics) {
	GinkgoHelper()
	m := metrics.New(prometheus.NewRegistry())
	store := budget.NewMemory(h.clock, 1000)
	srv := server.New(server.Options{Store: store, Memory: store, Metrics: m, Clock: h.clock,
		Logger: slog.New(slog.NewTextHandler(GinkgoWriter, nil))})
	_, err := srv.Apply([]byte(h.render(doc)), "test")
	Expect(err).NotTo(HaveOccurred())
	front := httptest.NewServer(srv)
	DeferCleanup(front.Close)
	return front.URL, m
}

// gathered is the value of the metric name without labels in reg.
func gathered(reg prometheus.Gatherer, name string) float64 {
	GinkgoHelper()
	fams, err := reg.Gather()
	Expect(err).NotTo(HaveOccurred())
	for _, f := range fams {
		if f.GetName() != name || len(f.GetMetric()) == 0 {
			continue
		}
		m := f.GetMetric()[0]
		if m.GetGauge() != nil {
			return m.GetGauge().GetValue()
		}
		return m.GetCounter().GetValue()
	}
	Fail("no metric " + name)
	return 0
}

// purge posts a purge to h's admin endpoints.
func purge(admin, body string) (int, map[string]any) {
	GinkgoHelper()
	resp, err := http.Post(admin+"/admin/cache/purge", "application/json", strings.NewReader(body))
	Expect(err).NotTo(HaveOccurred())
	defer resp.Body.Close()
	var out map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&out)
	return resp.StatusCode, out
}

var _ = Describe("The response cache across a fleet", func() {
	Describe("in a Redis of its own shared by two proxies", func() {
		var (
			h   *harness
			rs  *redisserver.Server
			b   string
			doc string
		)
		BeforeEach(func() {
			rs = redisserver.Start(GinkgoT())
			doc = keysDoc + "  limits:\n    per_api_key: {tokens_per_minute: 60000}\n" +
				fmt.Sprintf("cache: {storage: redis, redis: {url: %q, timeout_ms: 200}}\n", rs.URL())
			h = newHarness(doc)
			b, _ = otherProxy(h, doc)
		})

		It("serves on one proxy an answer stored through the other, to the same key only", func() {
			first := h.do("POST", "/v1/chat/completions", "sk-alice", chatBody)
			Expect(first.header.Get("X-Tokenwarden-Cache")).To(Equal("miss"))
			h.ended(1)
			hit := h.doAt(b, "POST", "/v1/chat/completions", "sk-alice", chatBody)
			Expect(hit.code).To(Equal(200))
			Expect(hit.header.Get("X-Tokenwarden-Cache")).To(Equal("hit"), "proxy B finds proxy A's answer")
			Expect(hit.body).To(Equal(first.body))
			Expect(h.llm.Requests()).To(HaveLen(1), "no backend call for the hit")

			other := h.doAt(b, "POST", "/v1/chat/completions", "sk-bob", chatBody)
			Expect(other.header.Get("X-Tokenwarden-Cache")).To(Equal("miss"), "another key's scope")
			Expect(h.llm.Requests()).To(HaveLen(2))
		})

		It("reads the cache's outage as misses on both proxies, never as refusals", func() {
			Expect(h.do("POST", "/v1/chat/completions", "sk-alice", chatBody).code).To(Equal(200))
			h.ended(1)
			Expect(rs.Kill()).To(Succeed())
			for i, url := range []string{h.front.URL, b, h.front.URL, b} {
				r := h.doAt(url, "POST", "/v1/chat/completions", "sk-alice", chatBody)
				Expect(r.code).To(Equal(200), string(r.body))
				Expect(r.header.Get("X-Tokenwarden-Cache")).To(Equal("miss"))
				Expect(h.llm.Requests()).To(HaveLen(i + 2))
			}
			Expect(gathered(h.reg, "tokenwarden_cache_errors_total")).To(BeNumerically(">=", 2), "each failed store call is counted")

			Expect(rs.Restart()).To(Succeed())
			Eventually(func() string {
				return h.do("POST", "/v1/chat/completions", "sk-alice", chatBody).header.Get("X-Tokenwarden-Cache")
			}, "10s", "100ms").Should(Equal("hit"), "the cache serves again once its Redis is back")
		})
	})

	It("keeps the bytes it holds within memory_bytes against many and huge answers, counting its evictions", func() {
		h := newHarness(keysDoc + "  limits:\n    per_api_key: {tokens_per_minute: 10000000}\n" +
			"cache: {storage: memory, memory_bytes: 1048576, max_entry_bytes: 65536}\n")
		h.llm.Set(fakellm.Behaviour{InputTokens: 10, OutputTokens: 20, PadBytes: 60000})
		const n = 40
		for i := range n {
			r := h.do("POST", "/v1/chat/completions", "sk-alice", strings.Replace(chatBody, "hello there", "request "+strconv.Itoa(i), 1))
			Expect(r.code).To(Equal(200))
			h.ended(i + 1)
			Expect(gathered(h.reg, "tokenwarden_cache_bytes")).To(BeNumerically("<=", 1048576))
		}
		held := gathered(h.reg, "tokenwarden_cache_bytes")
		entries := gathered(h.reg, "tokenwarden_cache_entries")
		Expect(held).To(BeNumerically(">", 1048576-2*65536), "the store is full, not emptied")
		Expect(entries).To(BeNumerically("<", n))
		Expect(gathered(h.reg, "tokenwarden_cache_evictions_total")).To(Equal(n - entries))

		// Huge answers pass to their clients whole and take nothing of the store.
		h.llm.Set(fakellm.Behaviour{InputTokens: 10, OutputTokens: 20, PadBytes: 4 << 20})
		for i := range 3 {
			r := h.do("POST", "/v1/chat/completions", "sk-alice", strings.Replace(chatBody, "hello there", "huge "+strconv.Itoa(i), 1))
			Expect(r.code).To(Equal(200))
			Expect(len(r.body)).To(BeNumerically(">", 4<<20))
			h.ended(n + i + 1)
		}
		Expect(gathered(h.reg, "tokenwarden_cache_bytes")).To(Equal(held))
		Expect(gathered(h.reg, "tokenwarden_cache_entries")).To(Equal(entries))
		Expect(counter(h.m.Cache.NotStored.WithLabelValues("too_large"))).To(Equal(3.0))
	})

	Describe("POST /admin/cache/purge", func() {
		It("drops the answers of a scope or a model, and refuses a purge that names nothing", func() {
			h := newHarness(keysDoc + "  limits:\n    per_api_key: {tokens_per_minute: 60000}\ncache: {storage: memory}\n")
			admin := httptest.NewServer(h.srv.AdminHandler(h.reg))
			DeferCleanup(admin.Close)
			mini := strings.Replace(chatBody, "gpt-4o", "gpt-4o-mini", 1)
			for _, key := range []string{"sk-alice", "sk-bob"} {
				Expect(h.do("POST", "/v1/chat/completions", key, chatBody).code).To(Equal(200))
				Expect(h.do("POST", "/v1/chat/completions", key, mini).code).To(Equal(200))
			}
			h.ended(4)
			result := func(key, body string) string {
				return h.do("POST", "/v1/chat/completions", key, body).header.Get("X-Tokenwarden-Cache")
			}

			code, out := purge(admin.URL, `{"api_key": "alice"}`)
			Expect(code).To(Equal(200))
			Expect(out).To(Equal(map[string]any{"purged": 2.0, "storage": "memory"}))
			Expect(result("sk-alice", chatBody)).To(Equal("miss"))
			Expect(result("sk-bob", chatBody)).To(Equal("hit"), "another scope's answers stay")

			code, out = purge(admin.URL, `{"model": "gpt-4o-mini"}`)
			Expect(code).To(Equal(200))
			Expect(out["purged"]).To(Equal(1.0), "bob's: alice's went with her scope")
			Expect(result("sk-bob", mini)).To(Equal("miss"))
			Expect(result("sk-bob", chatBody)).To(Equal("hit"))

			for _, bad := range []string{`{}`, `{"api_key": "alice", "team": "research"}`, `{"all": true, "model": "gpt-4o"}`, `{"key": "alice"}`} {
				code, _ = purge(admin.URL, bad)
				Expect(code).To(Equal(http.StatusBadRequest), bad)
			}
			code, _ = purge(admin.URL, `{"all": true}`)
			Expect(code).To(Equal(200))
			Expect(result("sk-bob", chatBody)).To(Equal("miss"))
		})

		It("answers 409 when the proxy stores no answers", func() {
			h := newHarness(keysDoc)
			admin := httptest.NewServer(h.srv.AdminHandler(h.reg))
			DeferCleanup(admin.Close)
			code, _ := purge(admin.URL, `{"all": true}`)
			Expect(code).To(Equal(http.StatusConflict))
		})
	})
})
