// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package server_test

import (
	"context"
	"fmt"
	"net/http"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/tokenwarden/tokenwarden/proxy/agentlimit/redisagents"
	"github.com/tokenwarden/tokenwarden/proxy/attribute"
	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/proxy/explain"
	"github.com/tokenwarden/tokenwarden/proxy/server"
	"github.com/tokenwarden/tokenwarden/test/fakellm"
	"github.com/tokenwarden/tokenwarden/test/redisserver"
)

// sessionInFlightRules allow each of a key's sessions two requests in flight, beside a
// minute's tokens per key (a later budget that may refuse).
const sessionInFlightRules = `
  rules:
  - name: two-per-session
    dimension: api_key
    count_by: session
    amount: in_flight
    windows: [{limit: 2}]
  - name: alice-tokens
    dimension: api_key
    subjects: [alice]
    windows: [{limit: 3000, rolling: {period: minute}}]
`

const sessionInFlightDoc = `
upstreams: [{name: default, url: UPSTREAM, timeout_seconds: 5}]
api_keys:
- {name: alice, key_sha256: HASH(alice)}
- {name: bob, key_sha256: HASH(bob)}
rate_limiting:
  budget_division: {replicas: 3}
  max_attribute_values: 3
` + sessionInFlightRules

const fleetSessionInFlightDoc = `
upstreams: [{name: default, url: UPSTREAM, timeout_seconds: 5}]
api_keys:
- {name: alice, key_sha256: HASH(alice)}
- {name: bob, key_sha256: HASH(bob)}
rate_limiting:
  storage: redis
  redis: {url: "%s", fallback_to_memory: true}
  budget_division: {replicas: 3}
  max_attribute_values: 3
` + sessionInFlightRules

// session is the header of session id.
func session(id string) []string { return []string{attribute.SessionHeader, id} }

// expectInFlightRefusal checks a refusal by the per-session in-flight rule.
func expectInFlightRefusal(r reply, what string) {
	GinkgoHelper()
	Expect(r.code).To(Equal(http.StatusTooManyRequests), "%s: %s", what, r.body)
	Expect(r.errorField("error", "code")).To(Equal("in_flight_limit"))
	Expect(r.errorField("error", "type")).NotTo(BeNil())
	Expect(r.errorField("error", "details", "rule")).To(Equal("two-per-session"))
	Expect(r.errorField("error", "details", "max_in_flight")).To(Equal(2.0))
	Expect(r.header.Get("Retry-After")).To(Equal("1"))
}

// sessionChat is a chat request of key in session id through the proxy at url.
func sessionChat(h *harness, url, key, id string) reply {
	GinkgoHelper()
	return h.doAt(url, "POST", "/v1/chat/completions", key, fleetChat, session(id)...)
}

var _ = Describe("In-flight rules", func() {
	It("hold each session of a key to its requests in flight, on each replica in memory mode, never divided", func() {
		h, g := gated(sessionInFlightDoc)
		out := make(chan sent, 4)
		send(context.Background(), h, out, "a1", "sk-alice", session("s1")...)
		send(context.Background(), h, out, "a2", "sk-alice", session("s1")...)
		Eventually(func() int { return len(g.order()) }).Should(Equal(2))

		// A limit of 2 among 3 replicas stays 2 on this one.
		expectInFlightRefusal(sessionChat(h, h.front.URL, "sk-alice", "s1"), "a third request of session s1")
		r := h.do("POST", "/v1/messages", "sk-alice", `{"model":"gpt-4o","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`, session("s1")...)
		Expect(r.code).To(Equal(http.StatusTooManyRequests), "in the Messages shape too: %s", r.body)
		Expect(r.errorField("error", "type")).To(Equal("rate_limit_error"))
		Expect(r.errorField("error", "details", "reason")).To(BeNil())

		send(context.Background(), h, out, "a3", "sk-alice", session("s2")...)
		send(context.Background(), h, out, "b1", "sk-bob", session("s1")...)
		Eventually(func() int { return len(g.order()) }).Should(Equal(4), "another session, and another key's s1, are their own")

		g.release()
		for range 4 {
			Expect((<-out).code).To(Equal(http.StatusOK))
		}
		for range 3 {
			Expect(sessionChat(h, h.front.URL, "sk-alice", "s1").code).To(Equal(http.StatusOK), "the ended requests gave their slots back")
		}
	})

	It("give a slot back when a later budget refuses the request", func() {
		h, g := gated(sessionInFlightDoc)
		out := make(chan sent, 1)
		send(context.Background(), h, out, "a1", "sk-alice", session("s1")...)
		Eventually(func() int { return len(g.order()) }).Should(Equal(1))
		big := `{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}],"max_tokens":5000}`
		for range 3 {
			r := h.do("POST", "/v1/chat/completions", "sk-alice", big, session("s1")...)
			Expect(r.code).To(Equal(http.StatusTooManyRequests))
			Expect(r.errorField("error", "code")).To(Equal("rate_limit_exceeded"), "the token budget refused: %s", r.body)
		}
		send(context.Background(), h, out, "a2", "sk-alice", session("s1")...)
		Eventually(func() int { return len(g.order()) }).Should(Equal(2), "the refused requests held no slot")
		g.release()
		<-out
		<-out
	})

	It("count the sessions beyond max_attribute_values in one overflow subject, under their key", func() {
		h, g := gated(sessionInFlightDoc)
		out := make(chan sent, 8)
		for _, s := range []string{"s1", "s2", "s3"} {
			send(context.Background(), h, out, s, "sk-alice", session(s)...)
		}
		Eventually(func() int { return len(g.order()) }).Should(Equal(3))
		send(context.Background(), h, out, "n1", "sk-alice", session("new-1")...)
		send(context.Background(), h, out, "n2", "sk-alice", session("new-2")...)
		Eventually(func() int { return len(g.order()) }).Should(Equal(5))
		expectInFlightRefusal(sessionChat(h, h.front.URL, "sk-alice", "new-3"), "a third new session shares the overflow's two")
		send(context.Background(), h, out, "b", "sk-bob", session("new-3")...)
		Eventually(func() int { return len(g.order()) }).Should(Equal(6), "another key's values are bounded apart")
		g.release()
		for range 6 {
			Expect((<-out).code).To(Equal(http.StatusOK))
		}
	})
})

// explainedInFlight is the explained in-flight window of the per-session rule for
// alice's requests in session id, as the proxy srv resolves them.
func explainedInFlight(srv *server.Server, id string) (explain.Answer, *budget.Explained) {
	GinkgoHelper()
	a, err := srv.Explain(context.Background(), explain.Query{APIKey: "alice", Model: "gpt-4o", Session: id})
	Expect(err).NotTo(HaveOccurred())
	b := budgetOf(a, "two-per-session")
	Expect(b.Window).To(Equal("in_flight"))
	Expect(b.Amount).To(Equal("in_flight"))
	Expect(b.Limit).To(Equal(2.0))
	Expect(b.ReplicaLimit).To(Equal(2.0), "never divided")
	Expect(b.InFlight).NotTo(BeNil(), "the requests in flight are read")
	return a, b
}

var _ = Describe("In-flight rules in /admin/explain and the rule metrics", func() {
	It("show a window's limit and this replica's requests in flight in memory mode, and which they are", func() {
		h, g := gated(sessionInFlightDoc)
		a, b := explainedInFlight(h.srv, "s1")
		Expect(b.Order).To(Equal(1), "a slot is taken before any bucket")
		Expect(*b.InFlight).To(BeZero())
		Expect(b.InFlightOf).To(Equal("replica"))
		Expect(a.InFlightError).To(BeEmpty())

		out := make(chan sent, 2)
		send(context.Background(), h, out, "a1", "sk-alice", session("s1")...)
		Eventually(func() int { return len(g.order()) }).Should(Equal(1))
		_, b = explainedInFlight(h.srv, "s1")
		Expect(*b.InFlight).To(Equal(int64(1)))
		Expect(*b.Remaining).To(Equal(1.0))
		Expect(*b.UsedPercent).To(Equal(50.0))
		Expect(counter(h.m.RuleUsed.WithLabelValues("two-per-session", "in_flight"))).To(Equal(0.5), "one of two in flight")
		Expect(counter(h.m.RuleLimit.WithLabelValues("two-per-session", "in_flight", "in_flight"))).To(Equal(2.0))
		Expect(counter(h.m.RuleRequests.WithLabelValues("two-per-session", "in_flight", "admitted"))).To(Equal(1.0))
		_, other := explainedInFlight(h.srv, "s2")
		Expect(*other.InFlight).To(BeZero(), "another session's counter is its own")

		send(context.Background(), h, out, "a2", "sk-alice", session("s1")...)
		Eventually(func() int { return len(g.order()) }).Should(Equal(2))
		expectInFlightRefusal(sessionChat(h, h.front.URL, "sk-alice", "s1"), "a third request of s1")
		a, b = explainedInFlight(h.srv, "s1")
		Expect(*b.InFlight).To(Equal(int64(2)))
		Expect(a.Tightest).To(Equal(b.Order), "the window at its limit is the tightest")
		Expect(counter(h.m.RuleUsed.WithLabelValues("two-per-session", "in_flight"))).To(Equal(1.0))
		Expect(counter(h.m.RuleRequests.WithLabelValues("two-per-session", "in_flight", "refused"))).To(Equal(1.0))

		g.release()
		for range 2 {
			Expect((<-out).code).To(Equal(http.StatusOK))
		}
		Eventually(func() int64 { _, b := explainedInFlight(h.srv, "s1"); return *b.InFlight }).Should(BeZero())
		Eventually(func() float64 { return counter(h.m.RuleUsed.WithLabelValues("two-per-session", "in_flight")) }).Should(BeZero(),
			"the gauge follows the requests' ends")
	})
})

var _ = Describe("In-flight rules on a fleet with Redis", func() {
	var redis *redisserver.Server
	BeforeEach(func() { redis = redisserver.Start(GinkgoT()) })

	sessionProxies := func(h *harness) ([]*redisProxy, func()) {
		prefix := fmt.Sprintf("inflight%d", redisPrefixes.Add(1))
		doc := fmt.Sprintf(fleetSessionInFlightDoc, redis.URL())
		relayURL, cut := relay(redis.Addr())
		ps := []*redisProxy{fleetProxy(h, relayURL, prefix, doc)}
		for range 2 {
			ps = append(ps, fleetProxy(h, redis.URL(), prefix, doc))
		}
		return ps, cut
	}

	It("hold a session's requests in flight as one total across three proxies", func() {
		h, g := gated(sessionInFlightDoc)
		ps, _ := sessionProxies(h)
		out := make(chan sent, 4)
		sendVia(context.Background(), ps[0].url, out, "a1", "sk-alice", session("s1")...)
		sendVia(context.Background(), ps[1].url, out, "a2", "sk-alice", session("s1")...)
		Eventually(func() int { return len(g.order()) }).Should(Equal(2))

		expectInFlightRefusal(sessionChat(h, ps[2].url, "sk-alice", "s1"), "a third request of s1, on the third proxy")
		sendVia(context.Background(), ps[2].url, out, "a3", "sk-alice", session("s2")...)
		Eventually(func() int { return len(g.order()) }).Should(Equal(3), "another session is its own")

		g.release()
		for range 3 {
			Expect((<-out).code).To(Equal(http.StatusOK))
		}
		for _, p := range ps {
			Expect(sessionChat(h, p.url, "sk-alice", "s1").code).To(Equal(http.StatusOK), "both requests ended: the limit is whole again")
		}
	})

	It("show in /admin/explain of any proxy the fleet's requests in flight of a window", func() {
		h, g := gated(sessionInFlightDoc)
		ps, _ := sessionProxies(h)
		out := make(chan sent, 2)
		sendVia(context.Background(), ps[0].url, out, "a1", "sk-alice", session("s1")...)
		Eventually(func() int { return len(g.order()) }).Should(Equal(1))
		sendVia(context.Background(), ps[1].url, out, "a2", "sk-alice", session("s1")...)
		Eventually(func() int { return len(g.order()) }).Should(Equal(2))
		a, b := explainedInFlight(ps[2].srv, "s1")
		Expect(*b.InFlight).To(Equal(int64(2)), "the two held on the other proxies")
		Expect(b.InFlightOf).To(Equal("fleet"))
		Expect(*b.UsedPercent).To(Equal(100.0))
		Expect(a.Tightest).To(Equal(b.Order))
		Expect(a.InFlightError).To(BeEmpty())
		Expect(counter(ps[1].m.RuleUsed.WithLabelValues("two-per-session", "in_flight"))).To(Equal(1.0), "the fleet's two of two, after the second slot")
		g.release()
		for range 2 {
			Expect((<-out).code).To(Equal(http.StatusOK))
		}
		Eventually(func() int64 { _, b := explainedInFlight(ps[2].srv, "s1"); return *b.InFlight }).Should(BeZero())
	})

	It("count the sessions beyond max_attribute_values in one overflow subject of the fleet", func() {
		h, g := gated(sessionInFlightDoc)
		ps, _ := sessionProxies(h)
		out := make(chan sent, 6)
		for i, s := range []string{"s1", "s2", "s3", "new-1", "new-2"} {
			sendVia(context.Background(), ps[i%3].url, out, s, "sk-alice", session(s)...)
			Eventually(func() int { return len(g.order()) }).Should(Equal(i + 1))
		}
		expectInFlightRefusal(sessionChat(h, ps[2].url, "sk-alice", "new-3"), "a third new session, on any proxy, shares the overflow's two")
		g.release()
		for range 5 {
			Expect((<-out).code).To(Equal(http.StatusOK))
		}
	})

	It("free a dead proxy's slots when their lease ends", func() {
		h, g := gated(sessionInFlightDoc)
		ps, cut := sessionProxies(h)
		out := make(chan sent, 2)
		sendVia(context.Background(), ps[0].url, out, "a1", "sk-alice", session("s1")...)
		sendVia(context.Background(), ps[0].url, out, "a2", "sk-alice", session("s1")...)
		Eventually(func() int { return len(g.order()) }).Should(Equal(2))
		// The first proxy loses its Redis for good while it holds both slots, as a
		// proxy that was killed: it neither gives them back nor renews them.
		cut()
		expectInFlightRefusal(sessionChat(h, ps[1].url, "sk-alice", "s1"), "the slots are held")
		h.clock.Advance(redisagents.DefaultLease - time.Second)
		expectInFlightRefusal(sessionChat(h, ps[2].url, "sk-alice", "s1"), "within the lease")
		h.clock.Advance(time.Second)
		g.release()
		out2 := make(chan sent, 2)
		sendVia(context.Background(), ps[1].url, out2, "b1", "sk-alice", session("s1")...)
		sendVia(context.Background(), ps[2].url, out2, "b2", "sk-alice", session("s1")...)
		for range 2 {
			Expect((<-out2).code).To(Equal(http.StatusOK), "the dead proxy's two slots ended with their lease")
		}
		for range 2 {
			<-out
		}
	})

	It("give a slot back on every way a request ends", func() {
		h := newHarness(sessionInFlightDoc)
		ps, _ := sessionProxies(h)
		slotsBackOnEveryEnd(h, ps)
	})
})

// slotsBackOnEveryEnd ends alice's requests of session s1 through ps[0] and ps[2] in
// every way a request ends, and checks after each that both of the session's two slots
// are back, by two requests through ps[1] (the clock stands still: no lease ends).
func slotsBackOnEveryEnd(h *harness, ps []*redisProxy) {
	GinkgoHelper()
	h.llm.Set(fakellmUsage(5, 5))
	next := func(what string) {
		GinkgoHelper()
		for range 2 {
			Eventually(func() int { return sessionChat(h, ps[1].url, "sk-alice", "s1").code }).Should(Equal(http.StatusOK), what)
		}
	}
	both := func(hdr ...string) []sent {
		out := make(chan sent, 2)
		sendVia(context.Background(), ps[0].url, out, "x", "sk-alice", append(session("s1"), hdr...)...)
		sendVia(context.Background(), ps[2].url, out, "y", "sk-alice", append(session("s1"), hdr...)...)
		return []sent{<-out, <-out}
	}

	By("an answer in full")
	for range 5 {
		Expect(sessionChat(h, ps[0].url, "sk-alice", "s1").code).To(Equal(http.StatusOK), "back to back on one connection")
	}
	for _, s := range both() {
		Expect(s.code).To(Equal(http.StatusOK))
	}
	next("after two answers")

	By("a stream the backend cuts")
	cut := `{"OutputTokens":8,"CutAfter":2}`
	for _, p := range []*redisProxy{ps[0], ps[2]} {
		Expect(postAll(p.url, "sk-alice", fleetStream, append(session("s1"), fakellm.HeaderBehaviour, cut)...)).To(Equal(http.StatusOK))
	}
	next("after two cut streams")

	By("an upstream error")
	for _, s := range both(fakellm.HeaderBehaviour, `{"Status":502}`) {
		Expect(s.code).To(Equal(http.StatusBadGateway))
	}
	next("after two upstream errors")

	By("a later budget's refusal")
	big := `{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}],"max_tokens":5000}`
	for _, p := range ps {
		Expect(h.doAt(p.url, "POST", "/v1/chat/completions", "sk-alice", big, session("s1")...).code).To(Equal(http.StatusTooManyRequests))
	}
	next("after three refusals by the token budget")

	By("a client that goes away, waiting for its answer and in a stream")
	clientsGoAway(h, ps, session("s1"), func(what string) {
		GinkgoHelper()
		expectInFlightRefusal(sessionChat(h, ps[1].url, "sk-alice", "s1"), what)
	}, next)
}

// agentCapsDoc writes a step cap per task and a token budget per session as the rules
// they are: requests and tokens counted by the attribute.
const agentCapsDoc = `
upstreams: [{name: default, url: UPSTREAM}]
api_keys:
- {name: alice, key_sha256: HASH(alice)}
rate_limiting:
  budget_division: {replicas: 1}
  rules:
  - {name: steps-per-task, dimension: api_key, count_by: task, amount: requests, windows: [{limit: 3, rolling: {period: day}}]}
  - {name: tokens-per-session, dimension: api_key, count_by: session, windows: [{limit: 200, rolling: {period: day}}]}
`

var _ = Describe("Step caps and token budgets per session, agent or task", func() {
	It("are requests and tokens rules counted by the attribute", func() {
		h := newHarness(agentCapsDoc)
		h.llm.Set(fakellmUsage(50, 50)) // each request uses 100 tokens
		task := func(id string) reply {
			return h.do("POST", "/v1/chat/completions", "sk-alice", fleetChat, attribute.TaskHeader, id, attribute.SessionHeader, id)
		}
		for i := range 2 {
			Expect(task("t1").code).To(Equal(http.StatusOK), "step %d", i+1)
		}
		r := task("t1")
		Expect(r.code).To(Equal(http.StatusTooManyRequests), "session t1 spent its 200 tokens: %s", r.body)
		Expect(r.errorField("error", "details", "rule")).To(Equal("tokens-per-session"))

		h.llm.Set(fakellmUsage(1, 1))
		for i := range 3 {
			Expect(task("t2").code).To(Equal(http.StatusOK), "step %d", i+1)
		}
		r = task("t2")
		Expect(r.code).To(Equal(http.StatusTooManyRequests), "a fourth step of task t2: %s", r.body)
		Expect(r.errorField("error", "details", "rule")).To(Equal("steps-per-task"))
		Expect(r.errorField("error", "type")).NotTo(BeNil())
		Expect(task("t3").code).To(Equal(http.StatusOK), "another task is its own")
	})
})
