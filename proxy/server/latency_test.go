// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package server_test

import (
	"context"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/tokenwarden/tokenwarden/proxy/server"
)

// histogram is the count and sum of a histogram's one series.
func histogram(o prometheus.Observer) (uint64, float64) {
	GinkgoHelper()
	var m dto.Metric
	Expect(o.(prometheus.Metric).Write(&m)).To(Succeed())
	return m.GetHistogram().GetSampleCount(), m.GetHistogram().GetSampleSum()
}

var _ = Describe("A request's latencies", func() {
	It("measure the upstream from the hand-off, after the queue wait, on the server's clock, as the access log does", func() {
		out := &logLines{}
		h := newObservedHarness(schedDoc, server.Options{AccessLog: out})
		g := &gate{next: h.llm, open: make(chan struct{})}
		h.backend.Config.Handler = g
		DeferCleanup(g.release)
		answers := make(chan sent, 2)

		// first holds the upstream's only place; second waits for it.
		send(context.Background(), h, answers, "first", "sk-bob")
		Eventually(g.order).Should(HaveLen(1))
		send(context.Background(), h, answers, "second", "sk-bob")
		Eventually(func() float64 { return counter(h.m.QueueLength.WithLabelValues("default", "interactive")) }).Should(Equal(1.0))
		// Ten seconds pass on the clock while first is at the upstream and second waits.
		h.clock.Advance(10 * time.Second)
		g.release()
		byName := map[string]sent{}
		for range 2 {
			a := <-answers
			Expect(a.code).To(Equal(200), a.body)
			byName[a.name] = a
		}

		n, sum := histogram(h.m.QueueWait.WithLabelValues("default", "interactive"))
		Expect(n).To(Equal(uint64(2)))
		Expect(sum).To(Equal(10.0), "second waited ten seconds for the capacity")
		n, sum = histogram(h.m.UpstreamDuration.WithLabelValues("default"))
		Expect(n).To(Equal(uint64(2)))
		Expect(sum).To(Equal(10.0), "first's upstream call took ten seconds, second's none: its wait is not the upstream's")
		// The handler observes a request's duration once it returns, after the answer.
		Eventually(func() uint64 {
			n, _ := histogram(h.m.RequestDuration.WithLabelValues("/v1/chat/completions"))
			return n
		}).
			Should(Equal(uint64(2)))
		_, sum = histogram(h.m.RequestDuration.WithLabelValues("/v1/chat/completions"))
		Expect(sum).To(Equal(20.0))

		// The access log measures the same way, on the same clock.
		first := out.logged(byName["first"].hdr.Get(server.RequestIDHeader))
		Expect(first).To(HaveKeyWithValue("upstream_latency_ms", 10000.0))
		Expect(first).To(HaveKeyWithValue("latency_ms", 10000.0))
		second := out.logged(byName["second"].hdr.Get(server.RequestIDHeader))
		Expect(second).To(HaveKeyWithValue("upstream_latency_ms", 0.0))
		Expect(second).To(HaveKeyWithValue("latency_ms", 10000.0))
		Expect(second).To(HaveKeyWithValue("time", "2026-11-01T12:00:00Z"), "the arrival on the server's clock")
	})
})
