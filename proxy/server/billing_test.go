// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package server_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
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

// The providers' answers that say an account is out of credit.
const (
	quotaBody      = `{"error":{"message":"You exceeded your current quota, please check your plan and billing details.","type":"insufficient_quota","param":null,"code":"insufficient_quota"}}`
	creditTooLow   = `{"type":"error","error":{"type":"invalid_request_error","message":"Your credit balance is too low to access the Anthropic API. Please go to Plans & Billing to upgrade or purchase credits."}}`
	openAIBillCode = `{"error":{"message":"You exceeded your current quota.","type":"insufficient_quota","param":null,"code":"%s"}}`
)

// billingAnswer is a backend answering every request with status and body.
func billingAnswer(status int, body string) fakellm.Behaviour {
	return fakellm.Behaviour{Status: status, ErrorBody: body}
}

// cooldownOf is the cooldown /admin/effective shows on the upstream of model.
func cooldownOf(srv *server.Server, model, up string) *server.Cooldown {
	GinkgoHelper()
	e, ok := srv.Effective()
	Expect(ok).To(BeTrue())
	for _, m := range e.Models {
		if m.Name != model {
			continue
		}
		for _, u := range m.Upstreams {
			if u.Upstream == up {
				return u.Cooldown
			}
		}
	}
	Fail("no upstream " + up + " of model " + model)
	return nil
}

// postAdmin sends POST path to srv's admin handler and decodes its JSON answer.
func postAdmin(srv *server.Server, path string, out any) int {
	GinkgoHelper()
	admin := httptest.NewServer(srv.AdminHandler(prometheus.NewRegistry()))
	defer admin.Close()
	resp, err := http.Post(admin.URL+path, "application/json", nil)
	Expect(err).NotTo(HaveOccurred())
	defer resp.Body.Close()
	Expect(json.NewDecoder(resp.Body).Decode(out)).To(Succeed())
	return resp.StatusCode
}

var _ = Describe("Billing cooldowns", func() {
	anthropicChat := func(r *registry) reply {
		GinkgoHelper()
		return r.do("POST", "/v1/messages", "sk-alice", `{"model":"sonnet","max_tokens":5,"messages":[]}`)
	}

	DescribeTable("an answer saying the account is out of credit cools the credential with the reason billing and fails over",
		func(anthropic bool, status int, body, code, message string) {
			r := newRegistry("")
			model, first, send := "gpt-4o", "primary", func() reply { return r.chat("sk-alice", 10) }
			if anthropic {
				model, first, send = "sonnet", "claude", func() reply { return anthropicChat(r) }
			}
			r.primary.Set(billingAnswer(status, body))
			rep := send()
			Expect(rep.code).To(Equal(200), string(rep.body))
			Expect(rep.header.Get(server.UpstreamHeader)).To(Equal("secondary"), "failed over to the next upstream")
			Expect(r.primary.Requests()).To(HaveLen(1))

			r.clock.Advance(10 * time.Minute) // past any rate cooldown's cap
			Expect(send().header.Get(server.UpstreamHeader)).To(Equal("secondary"))
			Expect(r.primary.Requests()).To(HaveLen(1), "the credential stays out: no request spent to learn it again")

			c := cooldownOf(r.srv, model, first)
			Expect(c).NotTo(BeNil())
			Expect(c.Reason).To(Equal("billing"))
			Expect(c.Code).To(Equal(code))
			Expect(c.Message).To(HavePrefix(message))
			Expect(c.RequestedSeconds).To(Equal(0.0), "the answer gave no timing")
			Expect(c.AppliedSeconds).To(Equal(900.0), "the default billing interval")
			Expect(gauge(r, `tokenwarden_upstream_cooling{reason="billing",upstream="`+first+`"}`)).To(Equal(1.0))
			Expect(gauge(r, `tokenwarden_upstream_cooling{reason="rate",upstream="`+first+`"}`)).To(Equal(0.0))
			Expect(gauge(r, `tokenwarden_upstream_cooldown_applied_seconds{reason="billing",upstream="`+first+`"}`)).To(Equal(900.0))
			Expect(r.srv.HealthReport()).To(ContainSubstring(`{"upstream":"` + first + `","breaker":"closed","cooling":true,"reason":"billing","message":"` + message))
		},
		Entry("OpenAI insufficient_quota on a 429", false, 429, quotaBody, "insufficient_quota", "You exceeded your current quota"),
		Entry("OpenAI insufficient_quota as the type, with no code", false, 429,
			`{"error":{"message":"You exceeded your current quota, please check your plan and billing details.","type":"insufficient_quota","param":null,"code":null}}`,
			"insufficient_quota", "You exceeded your current quota"),
		Entry("OpenAI credit_balance_exhausted", false, 429, strings.Replace(openAIBillCode, "%s", "credit_balance_exhausted", 1), "credit_balance_exhausted", "You exceeded"),
		Entry("OpenAI organization_spend_limit_exceeded", false, 429, strings.Replace(openAIBillCode, "%s", "organization_spend_limit_exceeded", 1), "organization_spend_limit_exceeded", "You exceeded"),
		Entry("OpenAI project_spend_limit_exceeded", false, 429, strings.Replace(openAIBillCode, "%s", "project_spend_limit_exceeded", 1), "project_spend_limit_exceeded", "You exceeded"),
		Entry("OpenAI organization_usage_limit_exceeded", false, 429, strings.Replace(openAIBillCode, "%s", "organization_usage_limit_exceeded", 1), "organization_usage_limit_exceeded", "You exceeded"),
		Entry("OpenAI billing_hard_limit_reached on a 400", false, 400,
			`{"error":{"message":"Billing hard limit has been reached","type":"invalid_request_error","param":null,"code":"billing_hard_limit_reached"}}`,
			"billing_hard_limit_reached", "Billing hard limit has been reached"),
		Entry("OpenAI billing_not_active", false, 429,
			`{"error":{"message":"Your account is not active, please check your billing details on our website.","type":"billing_not_active","param":null,"code":"billing_not_active"}}`,
			"billing_not_active", "Your account is not active"),
		Entry("Anthropic billing_error on a 402", true, 402,
			`{"type":"error","error":{"type":"billing_error","message":"There is an issue with your billing or payment information."}}`,
			"billing_error", "There is an issue with your billing"),
		Entry("Anthropic's credit balance too low on a 400", true, 400, creditTooLow, "invalid_request_error", "Your credit balance is too low"),
		Entry("Anthropic's spend limit reached on a 400", true, 400,
			`{"type":"error","error":{"type":"invalid_request_error","message":"You have reached your specified API usage limits. You will regain access on 2027-01-01 at 00:00 UTC."}}`,
			"invalid_request_error", "You have reached your specified API usage limits"),
	)

	It("tells a rate cooldown apart, and leaves a caller's other 400 a caller's mistake", func() {
		r := newRegistry("")
		r.primary.Set(fakellm.Behaviour{Status: 400, ErrorBody: `{"error":{"message":"'messages' is a required property","type":"invalid_request_error","code":null}}`})
		Expect(r.chat("sk-alice", 10).code).To(Equal(400), "no failover for a caller's mistake")
		Expect(r.secondary.Requests()).To(BeEmpty())
		Expect(cooldownOf(r.srv, "gpt-4o", "primary")).To(BeNil())

		r.primary.Set(fakellm.Behaviour{Status: 429, Header: map[string]string{"Retry-After": "20"}})
		Expect(r.chat("sk-alice", 10).header.Get(server.UpstreamHeader)).To(Equal("secondary"))
		c := cooldownOf(r.srv, "gpt-4o", "primary")
		Expect(c.Reason).To(Equal("rate"))
		Expect(c.RequestedSeconds).To(Equal(20.0))
		Expect(c.AppliedSeconds).To(Equal(20.0))
		Expect(c.Source).To(Equal("retry-after"))
		Expect(gauge(r, `tokenwarden_upstream_cooling{reason="rate",upstream="primary"}`)).To(Equal(1.0))
	})

	It("applies the configured interval, or the answer's when it asks for longer, capped", func() {
		r := newRegistry("routing: {billing_cooldown_seconds: 600}\n")
		r.primary.Set(fakellm.Behaviour{Status: 429, ErrorBody: quotaBody, Header: map[string]string{"Retry-After": "30"}})
		r.chat("sk-alice", 10)
		c := cooldownOf(r.srv, "gpt-4o", "primary")
		Expect([]float64{c.RequestedSeconds, c.AppliedSeconds}).To(Equal([]float64{30, 600}))
		Expect(c.Source).To(Equal("billing_cooldown_seconds"))

		r = newRegistry("routing: {billing_cooldown_seconds: 600}\n")
		r.primary.Set(fakellm.Behaviour{Status: 429, ErrorBody: quotaBody, Header: map[string]string{"Retry-After": "86400"}})
		r.chat("sk-alice", 10)
		c = cooldownOf(r.srv, "gpt-4o", "primary")
		Expect([]float64{c.RequestedSeconds, c.AppliedSeconds}).To(Equal([]float64{86400, 6 * 3600}), "capped at six hours")

		Expect(r.apply(strings.Replace(r.doc, "billing_cooldown_seconds: 600", "billing_cooldown_seconds: 60", 1))).To(MatchError(ContainSubstring("routing.billing_cooldown_seconds: 60 is outside 300 to 21600")))
	})

	It("probes on its own once the interval passed, and the account answering again ends it", func() {
		r := newRegistry("")
		r.primary.Set(billingAnswer(429, quotaBody))
		r.chat("sk-alice", 10)
		r.primary.Set(fakellmUsage(10, 20))

		r.clock.Advance(899 * time.Second)
		r.srv.SyncHealth(context.Background())
		Expect(r.primary.Requests()).To(HaveLen(1), "no probe before the interval")

		r.clock.Advance(time.Second)
		r.srv.SyncHealth(context.Background())
		Expect(r.primary.Requests()).To(HaveLen(2), "one probe")
		Expect(string(r.primary.Requests()[1].Body)).To(ContainSubstring(`"max_tokens":1`))
		Expect(cooldownOf(r.srv, "gpt-4o", "primary")).To(BeNil(), "the probe ended it")
		Expect(r.chat("sk-alice", 10).header.Get(server.UpstreamHeader)).To(Equal("primary"))
	})

	It("keeps it while the self-probe still finds no credit, relearning the interval", func() {
		r := newRegistry("")
		r.primary.Set(billingAnswer(429, quotaBody))
		r.chat("sk-alice", 10)
		r.clock.Advance(900 * time.Second)
		r.srv.SyncHealth(context.Background())
		Expect(r.primary.Requests()).To(HaveLen(2))
		c := cooldownOf(r.srv, "gpt-4o", "primary")
		Expect(c.Reason).To(Equal("billing"))
		Expect(c.Since).To(Equal(r.clock.Now()), "relearned at the probe")
		Expect(c.Until).To(Equal(r.clock.Now().Add(900 * time.Second)))
		r.srv.SyncHealth(context.Background())
		Expect(r.primary.Requests()).To(HaveLen(2), "the next probe waits for the new interval")
	})

	It("is ended sooner by the authenticated probe endpoint", func() {
		r := newRegistry("")
		r.primary.Set(billingAnswer(429, quotaBody))
		r.chat("sk-alice", 10)
		r.primary.Set(fakellmUsage(10, 20))
		var p server.ProbeResult
		Expect(postAdmin(r.srv, "/admin/upstreams/primary/probe", &p)).To(Equal(200))
		Expect(p.Status).To(Equal(200))
		Expect(p.Cleared).To(BeTrue())
		Expect(p.Cooldown).To(BeNil())
		Expect(r.chat("sk-alice", 10).header.Get(server.UpstreamHeader)).To(Equal("primary"))
	})

	It("relearns the interval from a probe that gets another 429", func() {
		r := newRegistry("")
		r.primary.Set(billingAnswer(429, quotaBody))
		r.chat("sk-alice", 10)
		r.clock.Advance(time.Minute)

		r.primary.Set(fakellm.Behaviour{Status: 429, ErrorBody: quotaBody, Header: map[string]string{"Retry-After": "3600"}})
		var p server.ProbeResult
		postAdmin(r.srv, "/admin/upstreams/primary/probe", &p)
		Expect(p.Cooldown.Reason).To(Equal("billing"))
		Expect([]float64{p.Cooldown.RequestedSeconds, p.Cooldown.AppliedSeconds}).To(Equal([]float64{3600, 3600}))
		Expect(p.Cooldown.Since).To(Equal(r.clock.Now()))

		r.primary.Set(fakellm.Behaviour{Status: 429, Header: map[string]string{"Retry-After": "7"}})
		postAdmin(r.srv, "/admin/upstreams/primary/probe", &p)
		Expect(p.Cooldown.Reason).To(Equal("rate"), "the account answers again, under rate pressure")
		Expect([]float64{p.Cooldown.RequestedSeconds, p.Cooldown.AppliedSeconds}).To(Equal([]float64{7, 7}))
		r.clock.Advance(7 * time.Second)
		r.primary.Set(fakellmUsage(10, 20))
		Expect(r.chat("sk-alice", 10).header.Get(server.UpstreamHeader)).To(Equal("primary"))
	})

	Context("on a fleet sharing one Redis", func() {
		var rs *redisserver.Server
		BeforeEach(func() { rs = redisserver.Start(GinkgoT()) })

		// replica is one more proxy of r's fleet on rs, with its billing cooldowns shared.
		replica := func(r *registry, prefix string) *server.Server {
			store, err := redisstore.New(redisstore.Options{URL: rs.URL(), Prefix: prefix, Logger: slog.New(slog.NewTextHandler(GinkgoWriter, nil))})
			Expect(err).NotTo(HaveOccurred())
			DeferCleanup(store.Close)
			srv := server.New(server.Options{Store: store, Memory: budget.NewMemory(r.clock, 1000), Metrics: metrics.New(prometheus.NewRegistry()),
				Clock: r.clock, AsyncSettle: true, Logger: slog.New(slog.NewTextHandler(GinkgoWriter, nil)), AccessLog: GinkgoWriter,
				HealthBoard: store.Board()})
			_, err = srv.Apply([]byte(r.render(r.doc)), "test")
			Expect(err).NotTo(HaveOccurred())
			return srv
		}
		chatVia := func(r *registry, srv *server.Server) reply {
			GinkgoHelper()
			front := httptest.NewServer(srv)
			defer front.Close()
			return r.chatAt(front.URL, "sk-alice", 10)
		}
		var prefixes atomic.Int64
		prefix := func() string { return "billing" + itoa(int(prefixes.Add(1))) }

		DescribeTable("teach the other replicas without a request of theirs, and one of them probes",
			func(anthropic bool, status int, body string) {
				r := newRegistry("")
				p := prefix()
				a, b := replica(r, p), replica(r, p)
				model, first, send := "gpt-4o", "primary", func(srv *server.Server) reply { return chatVia(r, srv) }
				if anthropic {
					model, first, send = "sonnet", "claude", func(srv *server.Server) reply {
						front := httptest.NewServer(srv)
						defer front.Close()
						return r.doAt(front.URL, "POST", "/v1/messages", "sk-alice", `{"model":"sonnet","max_tokens":5,"messages":[]}`)
					}
				}
				r.primary.Set(billingAnswer(status, body))
				Expect(send(a).header.Get(server.UpstreamHeader)).To(Equal("secondary"))
				Expect(r.primary.Requests()).To(HaveLen(1))

				b.SyncHealth(context.Background())
				c := cooldownOf(b, model, first)
				Expect(c).NotTo(BeNil(), "b learned it from the fleet's Redis")
				Expect(c.Reason).To(Equal("billing"))
				Expect(c.Message).To(Equal(cooldownOf(a, model, first).Message))
				Expect(send(b).header.Get(server.UpstreamHeader)).To(Equal("secondary"))
				Expect(r.primary.Requests()).To(HaveLen(1), "b sent no request to the cooled upstream")

				r.primary.Set(fakellmUsage(10, 20))
				r.clock.Advance(900 * time.Second)
				a.SyncHealth(context.Background())
				b.SyncHealth(context.Background())
				Expect(r.primary.Requests()).To(HaveLen(2), "one replica probed")
				a.SyncHealth(context.Background())
				b.SyncHealth(context.Background())
				Expect(cooldownOf(a, model, first)).To(BeNil())
				Expect(cooldownOf(b, model, first)).To(BeNil(), "the probe's clear reached both")
				Expect(send(b).header.Get(server.UpstreamHeader)).To(Equal(first))
				Expect(send(a).header.Get(server.UpstreamHeader)).To(Equal(first))
			},
			Entry("OpenAI insufficient_quota on a 429", false, 429, quotaBody),
			Entry("OpenAI project_spend_limit_exceeded", false, 429, strings.Replace(openAIBillCode, "%s", "project_spend_limit_exceeded", 1)),
			Entry("OpenAI billing_hard_limit_reached on a 400", false, 400,
				`{"error":{"message":"Billing hard limit has been reached","type":"invalid_request_error","param":null,"code":"billing_hard_limit_reached"}}`),
			Entry("Anthropic billing_error on a 402", true, 402,
				`{"type":"error","error":{"type":"billing_error","message":"There is an issue with your billing or payment information."}}`),
			Entry("Anthropic's credit balance too low on a 400", true, 400, creditTooLow),
		)

		It("shares a probe endpoint's clear and a probe's relearned interval", func() {
			r := newRegistry("")
			p := prefix()
			a, b := replica(r, p), replica(r, p)
			r.primary.Set(billingAnswer(429, quotaBody))
			chatVia(r, a)
			b.SyncHealth(context.Background())

			r.clock.Advance(time.Minute)
			r.primary.Set(fakellm.Behaviour{Status: 429, ErrorBody: quotaBody, Header: map[string]string{"Retry-After": "1800"}})
			var res server.ProbeResult
			postAdmin(b, "/admin/upstreams/primary/probe", &res)
			a.SyncHealth(context.Background())
			c := cooldownOf(a, "gpt-4o", "primary")
			Expect(c.AppliedSeconds).To(Equal(1800.0), "a learned b's relearned interval")
			Expect(c.Since).To(Equal(r.clock.Now()))

			r.primary.Set(fakellmUsage(10, 20))
			postAdmin(b, "/admin/upstreams/primary/probe", &res)
			Expect(res.Cleared).To(BeTrue())
			a.SyncHealth(context.Background())
			Expect(cooldownOf(a, "gpt-4o", "primary")).To(BeNil())
			n := len(r.primary.Requests())
			Expect(chatVia(r, a).header.Get(server.UpstreamHeader)).To(Equal("primary"))
			Expect(r.primary.Requests()).To(HaveLen(n + 1))
		})
	})
})
