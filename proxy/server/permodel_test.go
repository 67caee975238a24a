// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package server_test

import (
	"context"
	"net/http/httptest"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tokenwarden/tokenwarden/proxy/server"
	"github.com/tokenwarden/tokenwarden/test/fakellm"
)

const twoUpstreamsDoc = `
upstreams:
- {name: one, url: ONE, capacity: {max_in_flight_requests: 1}}
- {name: two, url: TWO, capacity: {max_in_flight_requests: 1}}
models:
- name: gpt-4o
  upstreams: [{upstream: one}, {upstream: two}]
api_keys:
- {name: bob, key_sha256: HASH(bob)}
rate_limiting:
  budget_division: {replicas: 1}
  limits:
    per_api_key: {tokens_per_minute: 100000}
`

var _ = Describe("A model with several upstreams at capacity", func() {
	It("sends a request to another upstream with room, and dispatches a waiter once, from the first to free", func() {
		one := &gate{next: fakellm.New(), open: make(chan struct{})}
		two := &gate{next: fakellm.New(), open: make(chan struct{})}
		s1, s2 := httptest.NewServer(one), httptest.NewServer(two)
		DeferCleanup(s1.Close)
		DeferCleanup(s2.Close)
		h := newHarness(strings.NewReplacer("ONE", s1.URL, "TWO", s2.URL).Replace(twoUpstreamsDoc))
		DeferCleanup(one.release)
		DeferCleanup(two.release)
		queued := func(up string) func() float64 {
			return func() float64 { return testutil.ToFloat64(h.m.QueueLength.WithLabelValues(up, "interactive")) }
		}
		out := make(chan sent, 4)
		ctx := context.Background()

		send(ctx, h, out, "a", "sk-bob")
		Eventually(one.order).Should(Equal([]string{"a"}))
		// The first upstream is full: the second takes the next request at once.
		send(ctx, h, out, "b", "sk-bob")
		Eventually(two.order).Should(Equal([]string{"b"}))
		Expect(queued("one")()).To(BeZero())
		Expect(queued("two")()).To(BeZero())

		// Both full: a client that goes away while it waits leaves both queues.
		gone, cancel := context.WithCancel(ctx)
		send(gone, h, out, "gone", "sk-bob")
		Eventually(queued("one")).Should(Equal(1.0))
		Eventually(queued("two")).Should(Equal(1.0))
		cancel()
		Expect((<-out).code).To(Equal(-1))
		Eventually(queued("one")).Should(BeZero())
		Eventually(queued("two")).Should(BeZero())

		// The next request waits in both queues and runs on whichever upstream frees
		// first, here the second; it leaves the first's queue.
		send(ctx, h, out, "c", "sk-bob")
		Eventually(queued("one")).Should(Equal(1.0))
		Eventually(queued("two")).Should(Equal(1.0))
		Consistently(func() int { return len(one.order()) + len(two.order()) }, "100ms").Should(Equal(2))
		two.open <- struct{}{}
		r := <-out
		Expect(r.name).To(Equal("b"))
		Expect(r.hdr.Get(server.UpstreamHeader)).To(Equal("two"))
		Eventually(two.order).Should(Equal([]string{"b", "c"}))
		Eventually(queued("one")).Should(BeZero())
		Expect(queued("two")()).To(BeZero())

		one.release()
		two.release()
		got := map[string]string{r.name: r.hdr.Get(server.UpstreamHeader)}
		for range 2 {
			r := <-out
			Expect(r.code).To(Equal(200), r.body)
			got[r.name] = r.hdr.Get(server.UpstreamHeader)
		}
		Expect(got).To(Equal(map[string]string{"a": "one", "b": "two", "c": "two"}))
		Expect(one.order()).To(Equal([]string{"a"}), "c ran once, on the upstream that dispatched it")

		// Nothing leaked: both upstreams take a request each again without waiting.
		send(ctx, h, out, "d", "sk-bob")
		send(ctx, h, out, "e", "sk-bob")
		for range 2 {
			Expect((<-out).code).To(Equal(200))
		}
		Expect(counter(h.m.QueueDispatches.WithLabelValues("one", "interactive"))).To(BeZero())
		Expect(counter(h.m.QueueDispatches.WithLabelValues("two", "interactive"))).To(Equal(1.0), "only c was dispatched from a queue")
	})
})
