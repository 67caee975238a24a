// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package server_test

import (
	"context"
	"net/http"
	"strings"
	"sync"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/test/fakellm"
)

// gate holds every request at the backend until the test lets it through, and records
// the order in which requests reached the backend by their X-Fakellm-Tenant header.
type gate struct {
	next    http.Handler
	mu      sync.Mutex
	arrived []string
	open    chan struct{}
	once    sync.Once
}

// release lets every request through, now and from now on.
func (g *gate) release() { g.once.Do(func() { close(g.open) }) }

func (g *gate) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	g.mu.Lock()
	g.arrived = append(g.arrived, r.Header.Get(fakellm.HeaderTenant))
	g.mu.Unlock()
	select {
	case <-g.open:
	case <-r.Context().Done():
		return
	}
	g.next.ServeHTTP(w, r)
}

func (g *gate) order() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]string(nil), g.arrived...)
}

const schedDoc = `
upstreams:
- name: default
  url: UPSTREAM
  capacity: {max_in_flight_requests: 1}
api_keys:
- {name: alice, key_sha256: HASH(alice), priority: batch}
- {name: bob, key_sha256: HASH(bob)}
rate_limiting:
  budget_division: {replicas: 1}
  limits:
    per_api_key: {tokens_per_minute: 100000}
`

// gated starts a harness whose backend holds every request until the gate opens for it.
func gated(doc string) (*harness, *gate) {
	h := newHarness(doc)
	g := &gate{next: h.llm, open: make(chan struct{})}
	h.backend.Config.Handler = g
	// Registered after the servers' Close, so it runs first: a failed spec leaves no
	// request held at the gate for Close to wait on.
	DeferCleanup(g.release)
	return h, g
}

type sent struct {
	name string
	code int
	body string
	hdr  http.Header
}

// send posts a chat request tagged name in the background; its answer arrives on out.
func send(ctx context.Context, h *harness, out chan<- sent, name, key string, hdr ...string) {
	go func() {
		defer GinkgoRecover()
		body := `{"model":"gpt-4o","messages":[{"role":"user","content":"hello there"}],"max_tokens":100}`
		req, _ := http.NewRequestWithContext(ctx, "POST", h.front.URL+"/v1/chat/completions", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+key)
		req.Header.Set(fakellm.HeaderTenant, name)
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			out <- sent{name: name, code: -1}
			return
		}
		defer resp.Body.Close()
		var b strings.Builder
		buf := make([]byte, 4096)
		for {
			n, err := resp.Body.Read(buf)
			b.Write(buf[:n])
			if err != nil {
				break
			}
		}
		out <- sent{name: name, code: resp.StatusCode, body: b.String(), hdr: resp.Header}
	}()
}

var _ = Describe("Scheduling at an upstream's capacity", func() {
	queued := func(h *harness, class string) func() float64 {
		return func() float64 { return testutil.ToFloat64(h.m.QueueLength.WithLabelValues("default", class)) }
	}

	It("lets an interactive request overtake a queue of batch requests, and lowers but never raises by header", func() {
		h, g := gated(schedDoc)
		out := make(chan sent, 16)
		ctx := context.Background()
		// The first batch request takes the only place.
		send(ctx, h, out, "b0", "sk-alice")
		Eventually(g.order).Should(Equal([]string{"b0"}))
		// More batch work queues behind it, then an interactive request arrives.
		for i, name := range []string{"b1", "b2", "b3"} {
			send(ctx, h, out, name, "sk-alice")
			Eventually(queued(h, "batch")).Should(Equal(float64(i + 1)))
		}
		// A batch key asking for interactive stays batch; an interactive key asking for
		// background goes behind all batch work.
		send(ctx, h, out, "raised", "sk-alice", "X-Tokenwarden-Priority", "interactive")
		Eventually(queued(h, "batch")).Should(Equal(4.0))
		send(ctx, h, out, "lowered", "sk-bob", "X-Tokenwarden-Priority", "Background")
		Eventually(queued(h, "background")).Should(Equal(1.0))
		send(ctx, h, out, "chat", "sk-bob")
		Eventually(queued(h, "interactive")).Should(Equal(1.0))

		// Nothing else reached the backend while it was at capacity.
		Consistently(g.order, "100ms").Should(Equal([]string{"b0"}))
		for range 7 {
			g.open <- struct{}{}
			r := <-out
			Expect(r.code).To(Equal(200), r.body)
		}
		Expect(g.order()).To(Equal([]string{"b0", "chat", "b1", "b2", "b3", "raised", "lowered"}))
		Expect(counter(h.m.QueueDispatches.WithLabelValues("default", "interactive"))).To(Equal(1.0))
		Expect(counter(h.m.QueueDispatches.WithLabelValues("default", "batch"))).To(Equal(4.0))
		Expect(queued(h, "batch")()).To(BeZero())
	})

	It("refuses a request that waits too long with 429 queue_timeout and releases its reservation", func() {
		h, g := gated(schedDoc + `
scheduling: {max_queue_wait_seconds: 1}
`)
		out := make(chan sent, 4)
		send(context.Background(), h, out, "b0", "sk-alice")
		Eventually(g.order).Should(HaveLen(1))
		held := h.level(budget.TokensMinute, budget.APIKey, "bob", 100000)
		send(context.Background(), h, out, "late", "sk-bob")
		r := <-out
		Expect(r.name).To(Equal("late"))
		Expect(r.code).To(Equal(http.StatusTooManyRequests))
		Expect(r.body).To(ContainSubstring(`"code":"queue_timeout"`))
		Expect(r.body).To(And(ContainSubstring(`"limit_type":"queue"`), ContainSubstring(`"class":"interactive"`)))
		Expect(r.hdr.Get("Retry-After")).To(Equal("1"), "at least a second, at most the class's deadline of 1 s")
		Expect(r.hdr.Get("Retry-After-Ms")).To(Equal("1000"))
		Eventually(func() float64 { return h.level(budget.TokensMinute, budget.APIKey, "bob", 100000) }).
			Should(Equal(held), "the queued request's reservation is released")
		Expect(counter(h.m.QueueLeft.WithLabelValues("default", "interactive", "queue_timeout"))).To(Equal(1.0))

		// A client that goes away while queued leaves the queue and frees its hold.
		ctx, cancel := context.WithCancel(context.Background())
		send(ctx, h, out, "gone", "sk-bob")
		Eventually(queued(h, "interactive")).Should(Equal(1.0))
		cancel()
		Eventually(queued(h, "interactive")).Should(BeZero())
		Expect((<-out).code).To(Equal(-1))
		Eventually(func() float64 { return h.level(budget.TokensMinute, budget.APIKey, "bob", 100000) }).Should(Equal(held))

		// Nothing leaked: once b0 ends the next request goes straight through.
		g.open <- struct{}{}
		Expect((<-out).code).To(Equal(200))
		g.release()
		Expect(h.chat("sk-bob", 100).code).To(Equal(200))
		Expect(counter(h.m.QueueDispatches.WithLabelValues("default", "interactive"))).To(BeZero(), "below capacity nothing waits")
	})

	It("keeps what is in flight and what waits across a reload, and applies the new capacity at once", func() {
		h, g := gated(schedDoc)
		out := make(chan sent, 4)
		send(context.Background(), h, out, "b0", "sk-alice")
		Eventually(g.order).Should(HaveLen(1))
		send(context.Background(), h, out, "b1", "sk-alice")
		Eventually(queued(h, "batch")).Should(Equal(1.0))
		send(context.Background(), h, out, "b2", "sk-alice")
		Eventually(queued(h, "batch")).Should(Equal(2.0))
		// Two places: b0 still holds one, so exactly one waiter goes.
		Expect(h.apply(strings.Replace(schedDoc, "max_in_flight_requests: 1", "max_in_flight_requests: 2", 1))).To(Succeed())
		Eventually(g.order).Should(Equal([]string{"b0", "b1"}))
		Consistently(g.order, "100ms").Should(HaveLen(2))
		Expect(queued(h, "batch")()).To(Equal(1.0))
		g.release()
		for range 3 {
			Expect((<-out).code).To(Equal(200))
		}
	})

	It("forwards everything at once with no capacity configured", func() {
		h, g := gated(strings.Replace(schedDoc, "  capacity: {max_in_flight_requests: 1}\n", "", 1))
		out := make(chan sent, 4)
		for _, n := range []string{"a", "b", "c"} {
			send(context.Background(), h, out, n, "sk-alice")
		}
		Eventually(func() int { return len(g.order()) }).Should(Equal(3))
		g.release()
		for range 3 {
			Expect((<-out).code).To(Equal(200))
		}
	})
})
