// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package server_test

import (
	"context"
	"log/slog"
	"net/http/httptest"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/proxy/budget/redisstore"
	"github.com/tokenwarden/tokenwarden/proxy/metrics"
	"github.com/tokenwarden/tokenwarden/proxy/server"
	"github.com/tokenwarden/tokenwarden/test/fakellm"
	"github.com/tokenwarden/tokenwarden/test/redisserver"
)

// sharingReplica is one proxy of r's fleet on rs under prefix, its billing cooldowns
// shared there, on r's clock.
func sharingReplica(r *registry, rs *redisserver.Server, prefix string) *server.Server {
	GinkgoHelper()
	log := slog.New(slog.NewTextHandler(GinkgoWriter, nil))
	store, err := redisstore.New(redisstore.Options{URL: rs.URL(), Prefix: prefix, Logger: log})
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(store.Close)
	srv := server.New(server.Options{Store: store, Memory: budget.NewMemory(r.clock, 1000), Metrics: metrics.New(prometheus.NewRegistry()),
		Clock: r.clock, AsyncSettle: true, Logger: log, AccessLog: GinkgoWriter, HealthBoard: store.Board()})
	_, err = srv.Apply([]byte(r.render(r.doc)), "test")
	Expect(err).NotTo(HaveOccurred())
	return srv
}

// chatOn sends one chat completion of alice's for gpt-4o through srv.
func chatOn(r *registry, srv *server.Server) reply {
	GinkgoHelper()
	front := httptest.NewServer(srv)
	defer front.Close()
	return r.chatAt(front.URL, "sk-alice", 10)
}

var _ = Describe("Billing and rate answers on two replicas of one fleet", func() {
	var (
		r    *registry
		a, b *server.Server
	)
	rateAnswer := fakellm.Behaviour{Status: 429, Header: map[string]string{"Retry-After": "20"}}
	BeforeEach(func() {
		rs := redisserver.Start(GinkgoT())
		r = newRegistry("")
		a, b = sharingReplica(r, rs, "order"), sharingReplica(r, rs, "order")
	})
	// expectBilling checks that srv holds primary out on the billing cooldown that
	// began at since, for the default interval, and sends it nothing once a rate
	// interval has passed.
	expectBilling := func(srv *server.Server, since time.Time) {
		GinkgoHelper()
		c := cooldownOf(srv, "gpt-4o", "primary")
		Expect(c).NotTo(BeNil())
		Expect(c.Reason).To(Equal("billing"))
		Expect(c.Since).To(Equal(since))
		Expect(c.Until).To(Equal(since.Add(900 * time.Second)))
		n := len(r.primary.Requests())
		r.clock.Advance(time.Minute)
		srv.SyncHealth(context.Background())
		Expect(chatOn(r, srv).header.Get(server.UpstreamHeader)).To(Equal("secondary"))
		Expect(r.primary.Requests()).To(HaveLen(n), "a rate interval's end does not end a billing cooldown")
	}

	It("ends on billing when one replica's billing answer comes before the other's plain 429", func() {
		r.primary.Set(billingAnswer(429, quotaBody))
		Expect(chatOn(r, a).header.Get(server.UpstreamHeader)).To(Equal("secondary"))
		billed := r.clock.Now()

		r.clock.Advance(time.Second / 2) // within the second before b reads the fleet's
		r.primary.Set(rateAnswer)
		Expect(chatOn(r, b).header.Get(server.UpstreamHeader)).To(Equal("secondary"))
		Expect(cooldownOf(b, "gpt-4o", "primary").Reason).To(Equal("rate"))
		b.SyncHealth(context.Background())
		a.SyncHealth(context.Background())
		expectBilling(b, billed)
		expectBilling(a, billed)
	})

	It("ends on billing when one replica's plain 429 comes before the other's billing answer", func() {
		r.primary.Set(rateAnswer)
		Expect(chatOn(r, b).header.Get(server.UpstreamHeader)).To(Equal("secondary"))
		Expect(cooldownOf(b, "gpt-4o", "primary").Reason).To(Equal("rate"))

		r.clock.Advance(time.Second / 2)
		r.primary.Set(billingAnswer(429, quotaBody))
		Expect(chatOn(r, a).header.Get(server.UpstreamHeader)).To(Equal("secondary"))
		billed := r.clock.Now()
		a.SyncHealth(context.Background())
		b.SyncHealth(context.Background())
		expectBilling(b, billed)
		expectBilling(a, billed)
	})

	It("keeps a newer billing cooldown when the other replica's clear of an older one comes after it", func() {
		r.primary.Set(billingAnswer(429, quotaBody))
		chatOn(r, a)
		b.SyncHealth(context.Background())
		r.clock.Advance(time.Minute)

		// a relearns it, and b, before it reads that, clears the one it knows.
		var res server.ProbeResult
		postAdmin(a, "/admin/upstreams/primary/probe", &res)
		relearned := r.clock.Now()
		Expect(res.Cooldown.Since).To(Equal(relearned))
		r.primary.Set(fakellmUsage(10, 20))
		postAdmin(b, "/admin/upstreams/primary/probe", &res)
		Expect(res.Cleared).To(BeTrue())
		a.SyncHealth(context.Background())
		Expect(cooldownOf(a, "gpt-4o", "primary").Since).To(Equal(relearned), "the older clear does not end a's newer cooldown")
	})

	It("reports a probe answered with a plain 429 during a billing cooldown as a rate cooldown, not cleared", func() {
		r.primary.Set(billingAnswer(429, quotaBody))
		chatOn(r, a)
		b.SyncHealth(context.Background())
		r.clock.Advance(time.Minute)

		r.primary.Set(fakellm.Behaviour{Status: 429, Header: map[string]string{"Retry-After": "7"}})
		var res server.ProbeResult
		Expect(postAdmin(a, "/admin/upstreams/primary/probe", &res)).To(Equal(200))
		Expect(res.Status).To(Equal(429))
		Expect(res.Cleared).To(BeFalse(), "the credential is still out: on a rate cooldown")
		Expect(res.Cooldown).NotTo(BeNil())
		Expect(res.Cooldown.Reason).To(Equal("rate"))
		Expect(res.Cooldown.AppliedSeconds).To(Equal(7.0))
		Expect(res.CoolingUntil).NotTo(BeNil())
		Expect(*res.CoolingUntil).To(Equal(r.clock.Now().Add(7 * time.Second)))

		// The account answers again: the fleet's billing cooldown ends, and the other
		// replica learns its own rate pressure from its own answers.
		b.SyncHealth(context.Background())
		Expect(cooldownOf(b, "gpt-4o", "primary")).To(BeNil())
		Expect(chatOn(r, b).header.Get(server.UpstreamHeader)).To(Equal("secondary"), "b's own 429")
		Expect(cooldownOf(b, "gpt-4o", "primary").Reason).To(Equal("rate"))
	})
})
