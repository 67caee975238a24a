// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package server_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"net/http"
	"runtime"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/test/fakellm"
)

const agentsDoc = `
upstreams:
- {name: default, url: UPSTREAM}
api_keys:
- {name: alice, key_sha256: HASH(alice), priority: batch, max_in_flight: 2}
- {name: bob, key_sha256: HASH(bob), run_token_budget: 300, run_max_steps: 3}
- {name: carol, key_sha256: HASH(carol), run_token_budget: 300, run_max_steps: 10}
scheduling:
  classes:
    interactive: {max_output_tokens: 50}
    batch: {max_output_tokens: 60, over_max_output_tokens: refuse}
agents: {max_runs: 3, run_idle_seconds: 60}
rate_limiting:
  budget_division: {replicas: 1}
  limits:
    per_api_key: {tokens_per_minute: 100000}
`

// forwarded is the JSON body of the backend's last request.
func forwarded(h *harness) map[string]any {
	GinkgoHelper()
	reqs := h.llm.Requests()
	Expect(reqs).NotTo(BeEmpty())
	var m map[string]any
	Expect(json.Unmarshal(reqs[len(reqs)-1].Body, &m)).To(Succeed())
	return m
}

var _ = Describe("Limits for agents", func() {
	It("refuses a key's request beyond its in-flight limit until one of them ends", func() {
		h, g := gated(agentsDoc)
		out := make(chan sent, 8)
		send(context.Background(), h, out, "a1", "sk-alice", "X-Tokenwarden-Priority", "background")
		send(context.Background(), h, out, "a2", "sk-alice", "X-Tokenwarden-Priority", "background")
		Eventually(func() int { return len(g.order()) }).Should(Equal(2))

		r := h.chat("sk-alice", 10)
		Expect(r.code).To(Equal(http.StatusTooManyRequests), string(r.body))
		Expect(r.errorField("error", "code")).To(Equal("in_flight_limit"))
		Expect(r.errorField("error", "limit_type")).To(Equal("in_flight"))
		Expect(r.errorField("error", "details", "max_in_flight")).To(Equal(2.0))
		Expect(r.errorField("error", "details", "class")).To(Equal("batch"))
		Expect(r.header.Get("Retry-After")).To(Equal("1"))
		// Refused before admission: it reserved nothing.
		Expect(h.level(budget.TokensMinute, budget.APIKey, "alice", 100000)).To(Equal(100000 - 2*chatEstimate(100)))
		// Another key is not limited by alice's requests: it reaches the backend.
		send(context.Background(), h, out, "b", "sk-bob")
		Eventually(func() int { return len(g.order()) }).Should(Equal(3))

		g.release()
		for range 3 {
			Expect((<-out).code).To(Equal(200))
		}
		// Every request ended: the limit is whole again.
		for range 2 {
			Expect(h.chat("sk-alice", 10).code).To(Equal(200))
		}
	})

	It("caps a run's tokens and steps by API key and run id, and forgets an idle run", func() {
		h := newHarness(agentsDoc)
		h.llm.Set(fakellmUsage(50, 50))
		run := func(key, id string) reply {
			return h.do("POST", "/v1/chat/completions", key,
				`{"model":"gpt-4o","messages":[{"role":"user","content":"hello there"}],"max_tokens":40}`,
				"X-Tokenwarden-Run-Id", id)
		}
		// Each request reserves chatEstimate(40) = 61 tokens and uses 100.
		Expect(run("sk-bob", "r1").code).To(Equal(200))
		Expect(run("sk-bob", "r1").code).To(Equal(200))
		// 200 spent + 61 reserved fits 300; a fourth would not, but the step cap of 3 comes first.
		Expect(run("sk-bob", "r1").code).To(Equal(200))
		r := run("sk-bob", "r1")
		Expect(r.code).To(Equal(http.StatusTooManyRequests), string(r.body))
		Expect(r.errorField("error", "code")).To(Equal("run_steps_exceeded"))
		Expect(r.header.Get("X-Should-Retry")).To(Equal("false"))
		Expect(r.errorField("error", "details", "run_steps")).To(Equal(3.0))

		// The same run id under another key is that key's own run.
		Expect(run("sk-carol", "r1").code).To(Equal(200))
		Expect(run("sk-carol", "r1").code).To(Equal(200))
		// A request without a run id is in no run.
		Expect(h.chat("sk-bob", 10).code).To(Equal(200))

		// The token budget: carol's run spent 200; with a larger answer's reservation it
		// is refused, and nothing was reserved from the key's budget.
		before := h.level(budget.TokensMinute, budget.APIKey, "carol", 100000)
		r = h.do("POST", "/v1/chat/completions", "sk-carol",
			`{"model":"gpt-4o","messages":[{"role":"user","content":"hello there"}],"max_tokens":45}`+strings.Repeat(" ", 400),
			"X-Tokenwarden-Run-Id", "r1")
		Expect(r.code).To(Equal(http.StatusOK), "200 spent + 66 reserved fits 300")
		Expect(h.level(budget.TokensMinute, budget.APIKey, "carol", 100000)).To(Equal(before - 100))
		before -= 100
		// On an Anthropic route the refusal is in Anthropic's shape, its reason in details.
		r = h.do("POST", "/v1/messages", "sk-carol", `{"model":"gpt-4o","max_tokens":40,"messages":[]}`, "X-Tokenwarden-Run-Id", "r1")
		Expect(r.code).To(Equal(http.StatusTooManyRequests), string(r.body))
		Expect(r.errorField("type")).To(Equal("error"))
		Expect(r.errorField("error", "type")).To(Equal("rate_limit_error"))
		Expect(r.errorField("error", "details", "reason")).To(Equal("run_budget_exceeded"))
		r = run("sk-carol", "r1")
		Expect(r.code).To(Equal(http.StatusTooManyRequests), string(r.body))
		Expect(r.errorField("error", "code")).To(Equal("run_budget_exceeded"))
		Expect(r.errorField("error", "limit_type")).To(Equal("run"))
		Expect(r.errorField("error", "details", "run_tokens_spent")).To(Equal(300.0))
		Expect(h.level(budget.TokensMinute, budget.APIKey, "carol", 100000)).To(Equal(before), "the refused request reserved nothing")

		// A run idle past run_idle_seconds is forgotten: it starts over.
		h.clock.Advance(61 * time.Second)
		Expect(run("sk-carol", "r1").code).To(Equal(200))
		Expect(h.srv.Runs()).To(Equal(1))

		// The runs kept are bounded (max_runs: 3): the least recently seen is forgotten.
		for _, id := range []string{"r2", "r3", "r4"} {
			Expect(run("sk-bob", id).code).To(Equal(200))
		}
		Expect(h.srv.Runs()).To(Equal(3))
	})

	It("gives a run back what a request that ran nothing reserved", func() {
		h := newHarness(agentsDoc)
		h.llm.Set(fakellm.Behaviour{Status: 500})
		for range 5 {
			Expect(h.do("POST", "/v1/chat/completions", "sk-bob", `{"model":"gpt-4o","max_tokens":40}`,
				"X-Tokenwarden-Run-Id", "r1").code).To(Equal(500))
		}
		h.llm.Set(fakellmUsage(1, 1))
		Expect(h.do("POST", "/v1/chat/completions", "sk-bob", `{"model":"gpt-4o","max_tokens":40}`,
			"X-Tokenwarden-Run-Id", "r1").code).To(Equal(200), "failed requests count no step and no token")
		r := h.do("POST", "/v1/chat/completions", "sk-bob", `{}`, "X-Tokenwarden-Run-Id", strings.Repeat("x", 300))
		Expect(r.code).To(Equal(http.StatusBadRequest))
		Expect(r.errorField("error", "code")).To(Equal("invalid_run_id"))
		r = h.do("POST", "/v1/chat/completions", "sk-bob", `{}`, "X-Tokenwarden-Run-Id", "run 1")
		Expect(r.code).To(Equal(http.StatusBadRequest), "a run id is visible ASCII, as every attribute header")
		Expect(r.errorField("error", "code")).To(Equal("invalid_run_id"))
		Expect(r.errorField("error", "message")).To(ContainSubstring("X-Tokenwarden-Run-Id header holds the byte 0x20"))
	})

	It("clamps or refuses max_tokens above the class's cap, and reserves the clamped value", func() {
		h, g := gated(agentsDoc)
		out := make(chan sent, 2)
		// bob is interactive, capped at 50 by clamping: send asks for 100.
		send(context.Background(), h, out, "b", "sk-bob")
		Eventually(func() int { return len(g.order()) }).Should(Equal(1))
		Expect(h.level(budget.TokensMinute, budget.APIKey, "bob", 100000)).To(Equal(100000-chatEstimate(50)),
			"the reservation is the clamped limit's")
		g.release()
		Expect((<-out).code).To(Equal(200))
		Expect(forwarded(h)["max_tokens"]).To(Equal(50.0))

		// A request with no limit gets the cap in the route's field.
		Expect(h.do("POST", "/v1/chat/completions", "sk-bob", `{"model":"gpt-4o","messages":[]}`).code).To(Equal(200))
		Expect(forwarded(h)["max_completion_tokens"]).To(Equal(50.0))
		// A compressed body is read decoded, clamped, and forwarded plain.
		var zb bytes.Buffer
		zw := gzip.NewWriter(&zb)
		_, _ = zw.Write([]byte(`{"model":"gpt-4o","max_tokens":900,"messages":[]}`))
		Expect(zw.Close()).To(Succeed())
		Expect(h.do("POST", "/v1/chat/completions", "sk-bob", zb.String(), "Content-Encoding", "gzip").code).To(Equal(200))
		Expect(forwarded(h)["max_tokens"]).To(Equal(50.0))
		last := h.llm.Requests()[len(h.llm.Requests())-1]
		Expect(last.Header.Get("Content-Encoding")).To(BeEmpty())
		// A request within the cap is forwarded as sent.
		Expect(h.chat("sk-bob", 20).code).To(Equal(200))
		Expect(forwarded(h)["max_tokens"]).To(Equal(20.0))

		// alice is batch, whose cap of 60 refuses.
		r := h.chat("sk-alice", 100)
		Expect(r.code).To(Equal(http.StatusBadRequest), string(r.body))
		Expect(r.errorField("error", "code")).To(Equal("max_tokens_above_class_cap"))
		Expect(r.errorField("error", "message")).To(ContainSubstring("max_tokens is 100, above the batch class's cap of 60"))
		Expect(h.level(budget.TokensMinute, budget.APIKey, "alice", 100000)).To(Equal(100000.0))
		// Lowered to background by header, alice has no cap.
		Expect(h.do("POST", "/v1/chat/completions", "sk-alice", `{"model":"gpt-4o","max_tokens":100}`,
			"X-Tokenwarden-Priority", "background").code).To(Equal(200))
	})
})

var _ = Describe("Scheduling metrics", func() {
	It("counts refusals by class and reason, tokens served by team, and clients' retries", func() {
		doc := strings.Replace(agentsDoc, "run_max_steps: 3}", "run_max_steps: 3, team: search}", 1)
		doc = strings.Replace(doc, "scheduling:", "- {name: tight, key_sha256: HASH(root), team: search, rate_limit_tokens_per_minute: 10}\nscheduling:", 1)
		h := newHarness(doc)
		h.llm.Set(fakellmUsage(30, 12))
		Expect(h.chat("sk-alice", 100).code).To(Equal(http.StatusBadRequest))
		Expect(h.chat("sk-root", 100).code).To(Equal(http.StatusTooManyRequests))
		Expect(h.chat("sk-bob", 10).code).To(Equal(200))
		Expect(h.do("POST", "/v1/chat/completions", "sk-bob", `{"model":"gpt-4o","max_tokens":5}`,
			"X-Stainless-Retry-Count", "2").code).To(Equal(200))
		Expect(h.do("POST", "/v1/chat/completions", "sk-bob", `{"model":"gpt-4o","max_tokens":5}`,
			"X-Stainless-Retry-Count", "0").code).To(Equal(200))

		a := &h.m.Agents
		Expect(counter(a.ClassRefusals.WithLabelValues("batch", "max_tokens_above_class_cap"))).To(Equal(1.0))
		Expect(counter(a.ClassRefusals.WithLabelValues("interactive", "token_budget"))).To(Equal(1.0))
		Expect(counter(a.TeamUsage.WithLabelValues("search", "input"))).To(Equal(90.0))
		Expect(counter(a.TeamUsage.WithLabelValues("search", "output"))).To(Equal(36.0))
		Expect(counter(a.Retries.WithLabelValues("/v1/chat/completions"))).To(Equal(1.0), "a first attempt (count 0) is no retry")

		// A team no key names any more loses its series.
		Expect(h.apply(agentsDoc)).To(Succeed())
		Expect(testutil.CollectAndCount(a.TeamUsage)).To(BeZero())
	})
})

var _ = Describe("Queue bounds", func() {
	const doc = schedDoc + `
scheduling:
  max_queue_wait_seconds: 600
  classes:
    interactive: {max_queue_wait_seconds: 1}
`
	It("ends an interactive wait at its class's deadline while batch work keeps waiting", func() {
		h, g := gated(doc)
		out := make(chan sent, 4)
		send(context.Background(), h, out, "b0", "sk-alice")
		Eventually(g.order).Should(HaveLen(1))
		send(context.Background(), h, out, "b1", "sk-alice")
		Eventually(func() float64 { return counter(h.m.QueueLength.WithLabelValues("default", "batch")) }).Should(Equal(1.0))
		began := time.Now()
		send(context.Background(), h, out, "chat", "sk-bob")
		r := <-out
		Expect(r.name).To(Equal("chat"))
		Expect(r.code).To(Equal(http.StatusTooManyRequests))
		Expect(r.body).To(ContainSubstring(`"code":"queue_timeout"`))
		Expect(r.body).To(ContainSubstring(`"class":"interactive"`))
		Expect(r.hdr.Get("Retry-After")).To(Equal("1"), "at most the class's deadline")
		Expect(time.Since(began)).To(BeNumerically("<", 10*time.Second))
		Expect(counter(h.m.QueueLength.WithLabelValues("default", "batch"))).To(Equal(1.0), "the batch request still waits")
		g.release()
		for range 2 {
			Expect((<-out).code).To(Equal(200))
		}
		// The wait histogram counts every request forwarded, b0's at 0: the timed-out
		// interactive request is not in it.
		Expect(waits(h, "batch")).To(Equal(uint64(2)))
		Expect(waits(h, "interactive")).To(BeZero())
	})

	It("bounds the bodies the queue holds in memory", func() {
		h, g := gated(doc + "  max_queue_bytes: 150\n")
		out := make(chan sent, 4)
		send(context.Background(), h, out, "b0", "sk-alice")
		Eventually(g.order).Should(HaveLen(1))
		// send's body is 88 bytes: one waits, a second would hold 176.
		send(context.Background(), h, out, "b1", "sk-alice")
		Eventually(func() float64 { return counter(h.m.QueueLength.WithLabelValues("default", "batch")) }).Should(Equal(1.0))
		send(context.Background(), h, out, "b2", "sk-alice")
		r := <-out
		Expect(r.name).To(Equal("b2"))
		Expect(r.code).To(Equal(http.StatusTooManyRequests))
		Expect(r.body).To(ContainSubstring(`"code":"queue_full"`))
		Expect(r.body).To(And(ContainSubstring(`"limit_type":"queue"`), ContainSubstring(`"class":"batch"`)))
		Expect(r.hdr.Get("Retry-After")).NotTo(BeEmpty(), "a full queue's refusal says when to retry")
		Expect(r.hdr.Get("Retry-After-Ms")).NotTo(BeEmpty())
		Expect(counter(h.m.Agents.ClassRefusals.WithLabelValues("batch", "queue_full"))).To(Equal(1.0))
		g.release()
		for range 2 {
			Expect((<-out).code).To(Equal(200))
		}
	})

	It("lets clients that disconnect while queued leave at once, with no hold and no goroutine left", func() {
		h, g := gated(doc)
		out := make(chan sent, 16)
		send(context.Background(), h, out, "b0", "sk-alice")
		Eventually(g.order).Should(HaveLen(1))
		full := h.level(budget.TokensMinute, budget.APIKey, "alice", 100000)
		before := runtime.NumGoroutine()

		ctx, cancel := context.WithCancel(context.Background())
		for i := range 8 {
			send(ctx, h, out, "gone", "sk-alice")
			Eventually(func() float64 { return counter(h.m.QueueLength.WithLabelValues("default", "batch")) }).Should(Equal(float64(i + 1)))
		}
		Expect(h.level(budget.TokensMinute, budget.APIKey, "alice", 100000)).To(Equal(full-8*chatEstimate(100)), "queued requests hold their reservations")
		cancel()
		for range 8 {
			Expect((<-out).code).To(Equal(-1))
		}
		Eventually(func() float64 { return counter(h.m.QueueLength.WithLabelValues("default", "batch")) }).Should(BeZero())
		Eventually(func() float64 { return h.level(budget.TokensMinute, budget.APIKey, "alice", 100000) }).Should(Equal(full))
		Expect(counter(h.m.QueueLeft.WithLabelValues("default", "batch", "canceled"))).To(Equal(8.0))
		http.DefaultClient.CloseIdleConnections()
		Eventually(runtime.NumGoroutine, "5s").Should(BeNumerically("<=", before), "no goroutine is left by the waits")
		g.release()
		Expect((<-out).code).To(Equal(200))
	})
})

// waits is the number of waits the class's histogram observed.
func waits(h *harness, class string) uint64 {
	GinkgoHelper()
	families, err := h.reg.Gather()
	Expect(err).NotTo(HaveOccurred())
	for _, f := range families {
		if f.GetName() != "tokenwarden_queue_wait_seconds" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "class" && l.GetValue() == class {
					return m.GetHistogram().GetSampleCount()
				}
			}
		}
	}
	return 0
}
