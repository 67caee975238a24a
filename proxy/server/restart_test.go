// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package server_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/proxy/metrics"
	"github.com/tokenwarden/tokenwarden/proxy/server"
	"github.com/tokenwarden/tokenwarden/test/redisserver"
)

// syncBuffer is a log sink the server may write to while the test reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

var _ = Describe("A reload of a setting only a restart applies", func() {
	doc := func(redisURL, listen string) string {
		return fmt.Sprintf(`
listen: %q
upstreams: [{name: default, url: "http://127.0.0.1:1"}]
rate_limiting:
  storage: redis
  redis: {url: %q}
`, listen, redisURL)
	}

	It("is shown in /admin/effective, logged, and gauged until the document changes back", func() {
		var logs syncBuffer
		mem := budget.NewMemory(budget.SystemClock{}, 10)
		reg := prometheus.NewRegistry()
		m := metrics.New(reg)
		srv := server.New(server.Options{Store: mem, Memory: mem, Metrics: m, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
		admin := httptest.NewServer(srv.AdminHandler(reg))
		DeferCleanup(admin.Close)
		effective := func() server.Effective {
			resp, err := http.Get(admin.URL + "/admin/effective")
			Expect(err).NotTo(HaveOccurred())
			defer resp.Body.Close()
			body, err := io.ReadAll(resp.Body)
			Expect(err).NotTo(HaveOccurred())
			Expect(string(body)).To(ContainSubstring(`"restart_required": [`), "an empty list, never null")
			var e server.Effective
			Expect(json.Unmarshal(body, &e)).To(Succeed())
			return e
		}

		_, err := srv.Apply([]byte(doc("redis://a:6379/0", "127.0.0.1:8080")), "test")
		Expect(err).NotTo(HaveOccurred())
		Expect(effective().RestartRequired).To(BeEmpty())
		Expect(testutil.ToFloat64(m.RestartRequired)).To(BeZero())

		_, err = srv.Apply([]byte(doc("redis://b:6379/0", "127.0.0.1:8081")), "test")
		Expect(err).NotTo(HaveOccurred())
		Expect(effective().RestartRequired).To(Equal([]string{"listen", "rate_limiting.redis.url"}))
		Expect(testutil.ToFloat64(m.RestartRequired)).To(Equal(1.0))
		Expect(logs.String()).To(SatisfyAll(
			ContainSubstring("take effect only at the next restart"),
			ContainSubstring("rate_limiting.redis.url"), ContainSubstring("listen")))

		_, err = srv.Apply([]byte(doc("redis://a:6379/0", "127.0.0.1:8080")), "test")
		Expect(err).NotTo(HaveOccurred())
		Expect(effective().RestartRequired).To(BeEmpty())
		Expect(testutil.ToFloat64(m.RestartRequired)).To(BeZero())
		Expect(logs.String()).To(ContainSubstring("No config change waits for a restart any more"))
	})

	It("never names a field a command-line flag sets", func() {
		mem := budget.NewMemory(budget.SystemClock{}, 10)
		m := metrics.New(prometheus.NewRegistry())
		srv := server.New(server.Options{Store: mem, Memory: mem, Metrics: m, Overridden: []string{"listen"},
			Logger: slog.New(slog.NewTextHandler(GinkgoWriter, nil))})
		_, err := srv.Apply([]byte(doc("redis://a:6379/0", "127.0.0.1:8080")), "test")
		Expect(err).NotTo(HaveOccurred())
		_, err = srv.Apply([]byte(doc("redis://a:6379/0", "127.0.0.1:8081")), "test")
		Expect(err).NotTo(HaveOccurred())
		e, _ := srv.Effective()
		Expect(e.RestartRequired).To(BeEmpty())
	})

	It("applies fallback_to_memory at once", func() {
		h := newHarness(keysDoc)
		rs := redisserver.Start(GinkgoT())
		p := newRedisProxy(h, rs.URL(), fmt.Sprintf("fleet%d", redisPrefixes.Add(1)), true, redisDoc(rs.URL(), true, "100000"))
		send := via(h, p.url)
		Expect(send("sk-alice", 100).code).To(Equal(200))
		Expect(rs.Kill()).To(Succeed())
		Expect(send("sk-alice", 100).code).To(Equal(200), "admitted on the replica's share")

		_, err := p.srv.Apply([]byte(h.render(redisDoc(rs.URL(), false, "100000"))), "test")
		Expect(err).NotTo(HaveOccurred())
		r := send("sk-alice", 100)
		Expect(r.code).To(Equal(503), "fails closed from the reload on")
		Expect(r.header.Get("Retry-After")).To(Equal("5"))
		e, _ := p.srv.Effective()
		Expect(e.RestartRequired).To(BeEmpty())

		_, err = p.srv.Apply([]byte(h.render(redisDoc(rs.URL(), true, "100000"))), "test")
		Expect(err).NotTo(HaveOccurred())
		Expect(send("sk-alice", 100).code).To(Equal(200), "falls back again")
	})
})
