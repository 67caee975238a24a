// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package server_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/tokenwarden/tokenwarden/proxy/budget/redisstore"
	"github.com/tokenwarden/tokenwarden/proxy/server"

	"github.com/tokenwarden/tokenwarden/proxy/agentlimit/redisagents"
	"github.com/tokenwarden/tokenwarden/test/fakellm"
	"github.com/tokenwarden/tokenwarden/test/redisserver"
)

// fleetAgentsDoc gives alice two requests in flight, bob runs of 300 tokens and carol
// runs of three steps, on the Redis at %s.
const fleetAgentsDoc = `
upstreams: [{name: default, url: UPSTREAM, timeout_seconds: 5}]
api_keys:
- {name: alice, key_sha256: HASH(alice), max_in_flight: 2}
- {name: bob, key_sha256: HASH(bob), run_token_budget: 300}
- {name: carol, key_sha256: HASH(carol), run_max_steps: 3}
rate_limiting:
  storage: redis
  redis: {url: "%s", fallback_to_memory: true}
  budget_division: {replicas: 3}
  limits:
    per_api_key: {tokens_per_minute: 100000}
`

const (
	fleetChat   = `{"model":"gpt-4o","messages":[{"role":"user","content":"hello there"}],"max_tokens":40}`
	fleetStream = `{"model":"gpt-4o","stream":true,"messages":[{"role":"user","content":"hello there"}],"max_tokens":40}`
)

// sendVia posts a chat request of key tagged name to the proxy at url in the
// background, with the headers hdr; its answer arrives on out.
func sendVia(ctx context.Context, url string, out chan<- sent, name, key string, hdr ...string) {
	sendBodyVia(ctx, url, out, name, key, fleetChat, hdr...)
}

// sendBodyVia is sendVia with the request's body.
func sendBodyVia(ctx context.Context, url string, out chan<- sent, name, key, body string, hdr ...string) {
	go func() {
		defer GinkgoRecover()
		req, _ := http.NewRequestWithContext(ctx, "POST", url+"/v1/chat/completions", strings.NewReader(body))
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
		b, _ := io.ReadAll(resp.Body)
		out <- sent{name: name, code: resp.StatusCode, body: string(b), hdr: resp.Header}
	}()
}

// clientsGoAway has alice's two requests with the headers hdr, on the first proxy and
// the third, hold the limit while they wait for their answer (then, again, in a
// stream); refused checks that the second proxy is refused meanwhile. Both clients go
// away, and next checks that their slots were given back.
func clientsGoAway(h *harness, ps []*redisProxy, hdr []string, refused, next func(what string)) {
	GinkgoHelper()
	for _, c := range []struct{ body, b string }{
		{fleetChat, `{"Latency":20000000000}`},
		{fleetStream, `{"OutputTokens":1000,"ChunkDelay":50000000}`},
	} {
		ctx, cancel := context.WithCancel(context.Background())
		DeferCleanup(cancel)
		out := make(chan sent, 2)
		before := len(h.llm.Requests())
		all := append(append([]string(nil), hdr...), fakellm.HeaderBehaviour, c.b)
		sendBodyVia(ctx, ps[0].url, out, "x", "sk-alice", c.body, all...)
		sendBodyVia(ctx, ps[2].url, out, "y", "sk-alice", c.body, all...)
		Eventually(func() int { return len(h.llm.Requests()) - before }).Should(Equal(2), "both reach the backend")
		refused(c.b)
		cancel()
		<-out
		<-out
		next("after two clients went away")
	}
}

// threeProxies are three replicas on redis under one prefix, in front of h's backend;
// the first reaches Redis through a relay (cut kills its connections).
func threeProxies(h *harness, redis *redisserver.Server) (ps []*redisProxy, cut func()) {
	prefix := fmt.Sprintf("agents%d", redisPrefixes.Add(1))
	doc := fmt.Sprintf(fleetAgentsDoc, redis.URL())
	relayURL, cut := relay(redis.Addr())
	ps = append(ps, fleetProxy(h, relayURL, prefix, doc))
	for range 2 {
		ps = append(ps, fleetProxy(h, redis.URL(), prefix, doc))
	}
	return ps, cut
}

// fleetProxy is newRedisProxy with timeouts a loaded machine meets: a call that times
// out leaves the limits for agents to the replica, which these specs must not see.
func fleetProxy(h *harness, redisURL, prefix, doc string) *redisProxy {
	return startRedisProxy(h, redisstore.Options{URL: redisURL, Prefix: prefix,
		DialTimeout: 2 * time.Second, ReadTimeout: 2 * time.Second, WriteTimeout: 2 * time.Second}, true, doc, server.Options{})
}

// relay forwards TCP connections to addr and returns its redis:// URL and a cut that
// closes it and every connection through it, for good: a replica that was killed
// reaches Redis no more.
func relay(addr string) (string, func()) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	Expect(err).NotTo(HaveOccurred())
	var mu sync.Mutex
	var conns []net.Conn
	cut := func() {
		_ = ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			_ = c.Close()
		}
		conns = nil
	}
	DeferCleanup(cut)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", addr)
			if err != nil {
				_ = c.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, c, up)
			mu.Unlock()
			go func() { _, _ = io.Copy(up, c); _ = up.Close() }()
			go func() { _, _ = io.Copy(c, up); _ = c.Close() }()
		}
	}()
	return "redis://" + ln.Addr().String() + "/0", cut
}

// postAll posts body to the proxy at url and reads its answer, however it ends.
func postAll(url, key, body string, hdr ...string) int {
	GinkgoHelper()
	req, err := http.NewRequest("POST", url+"/v1/chat/completions", strings.NewReader(body))
	Expect(err).NotTo(HaveOccurred())
	req.Header.Set("Authorization", "Bearer "+key)
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	Expect(err).NotTo(HaveOccurred())
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode
}

// runStep sends a step of key's run id through the proxy at url.
func runStep(h *harness, url, key, id string) reply {
	GinkgoHelper()
	return h.doAt(url, "POST", "/v1/chat/completions", key,
		`{"model":"gpt-4o","messages":[{"role":"user","content":"hello there"}],"max_tokens":40}`, "X-Tokenwarden-Run-Id", id)
}

var _ = Describe("Limits for agents on a fleet with Redis", func() {
	var redis *redisserver.Server
	BeforeEach(func() { redis = redisserver.Start(GinkgoT()) })

	It("holds a key's requests in flight as one total across three proxies", func() {
		h, g := gated(keysDoc)
		ps, _ := threeProxies(h, redis)
		out := make(chan sent, 4)
		sendVia(context.Background(), ps[0].url, out, "a1", "sk-alice")
		sendVia(context.Background(), ps[1].url, out, "a2", "sk-alice")
		Eventually(func() int { return len(g.order()) }).Should(Equal(2))

		r := h.chatAt(ps[2].url, "sk-alice", 10)
		Expect(r.code).To(Equal(http.StatusTooManyRequests), "a third request in flight, on the third proxy: %s", r.body)
		Expect(r.errorField("error", "code")).To(Equal("in_flight_limit"))
		Expect(r.errorField("error", "details", "max_in_flight")).To(Equal(2.0))

		g.release()
		for range 2 {
			Expect((<-out).code).To(Equal(http.StatusOK))
		}
		for _, p := range ps {
			Expect(h.chatAt(p.url, "sk-alice", 10).code).To(Equal(http.StatusOK), "both requests ended: the limit is whole again")
		}
	})

	It("holds a run's tokens and steps as one total across three proxies", func() {
		h := newHarness(keysDoc)
		ps, _ := threeProxies(h, redis)
		h.llm.Set(fakellmUsage(50, 50)) // each step reserves 61 tokens and uses 100
		for i, p := range ps {
			Expect(runStep(h, p.url, "sk-bob", "r1").code).To(Equal(http.StatusOK), "step %d", i+1)
		}
		r := runStep(h, ps[0].url, "sk-bob", "r1")
		Expect(r.code).To(Equal(http.StatusTooManyRequests), "the run spent 300 tokens over three proxies: %s", r.body)
		Expect(r.errorField("error", "code")).To(Equal("run_budget_exceeded"))
		Expect(r.errorField("error", "details", "run_tokens_spent")).To(Equal(300.0))
		Expect(r.header.Get("X-Should-Retry")).To(Equal("false"))
		Expect(runStep(h, ps[1].url, "sk-bob", "r2").code).To(Equal(http.StatusOK), "another run is its own")

		for i, p := range ps {
			Expect(runStep(h, p.url, "sk-carol", "r1").code).To(Equal(http.StatusOK), "step %d", i+1)
		}
		r = runStep(h, ps[2].url, "sk-carol", "r1")
		Expect(r.code).To(Equal(http.StatusTooManyRequests), "a fourth step of a run of three: %s", r.body)
		Expect(r.errorField("error", "code")).To(Equal("run_steps_exceeded"))
		Expect(r.errorField("error", "details", "run_steps")).To(Equal(3.0))

		// A step that ran nothing (the upstream failed) gives its step back.
		h.llm.Set(fakellm.Behaviour{Status: http.StatusInternalServerError})
		Expect(runStep(h, ps[0].url, "sk-carol", "r2").code).To(Equal(http.StatusInternalServerError))
		h.llm.Set(fakellmUsage(5, 5))
		for i, p := range ps {
			Expect(runStep(h, p.url, "sk-carol", "r2").code).To(Equal(http.StatusOK), "step %d after a failed one", i+1)
		}
	})

	It("frees a dead proxy's slots in flight when their lease ends", func() {
		h, g := gated(keysDoc)
		ps, cut := threeProxies(h, redis)
		out := make(chan sent, 4)
		sendVia(context.Background(), ps[0].url, out, "a1", "sk-alice")
		sendVia(context.Background(), ps[0].url, out, "a2", "sk-alice")
		Eventually(func() int { return len(g.order()) }).Should(Equal(2))
		// The first proxy loses its Redis for good while it holds both slots: it can
		// neither give them back nor renew them, as a proxy that was killed.
		cut()
		Expect(h.chatAt(ps[1].url, "sk-alice", 10).code).To(Equal(http.StatusTooManyRequests), "the slots are held")

		h.clock.Advance(redisagents.DefaultLease - time.Second)
		Expect(h.chatAt(ps[1].url, "sk-alice", 10).code).To(Equal(http.StatusTooManyRequests), "within the lease")
		h.clock.Advance(time.Second)
		g.release()
		out2 := make(chan sent, 2)
		sendVia(context.Background(), ps[1].url, out2, "b1", "sk-alice")
		sendVia(context.Background(), ps[2].url, out2, "b2", "sk-alice")
		for range 2 {
			Expect((<-out2).code).To(Equal(http.StatusOK), "the dead proxy's two slots ended with their lease")
		}
		for range 2 {
			<-out
		}
	})

	It("gives a slot back on every way a request ends", func() {
		h := newHarness(keysDoc)
		ps, _ := threeProxies(h, redis)
		h.llm.Set(fakellmUsage(5, 5))
		next := func(what string) {
			GinkgoHelper()
			// The clock stands still: no lease ends, only the request's end frees its slots.
			Eventually(func() int { return h.chatAt(ps[1].url, "sk-alice", 10).code }).Should(Equal(http.StatusOK), what)
		}
		// Two at once fill the fleet's limit, on whichever proxies, so each path is
		// tried with both slots taken by it.
		both := func(hdr ...string) []sent {
			out := make(chan sent, 2)
			sendVia(context.Background(), ps[0].url, out, "x", "sk-alice", hdr...)
			sendVia(context.Background(), ps[2].url, out, "y", "sk-alice", hdr...)
			return []sent{<-out, <-out}
		}

		By("an answer in full")
		for range 5 {
			Expect(h.chatAt(ps[0].url, "sk-alice", 10).code).To(Equal(http.StatusOK), "back to back on one connection")
		}
		for _, s := range both() {
			Expect(s.code).To(Equal(http.StatusOK))
		}
		next("after two answers")

		By("a stream the backend cuts")
		cut := `{"OutputTokens":8,"CutAfter":2}`
		for _, p := range []*redisProxy{ps[0], ps[2]} {
			Expect(postAll(p.url, "sk-alice", fleetStream, fakellm.HeaderBehaviour, cut)).To(Equal(http.StatusOK))
		}
		next("after two cut streams")

		By("an upstream error")
		for _, s := range both(fakellm.HeaderBehaviour, `{"Status":502}`) {
			Expect(s.code).To(Equal(http.StatusBadGateway))
		}
		next("after two upstream errors")

		By("a client that goes away, waiting for its answer and in a stream")
		clientsGoAway(h, ps, nil, func(what string) {
			GinkgoHelper()
			Expect(h.chatAt(ps[1].url, "sk-alice", 10).code).To(Equal(http.StatusTooManyRequests), what)
		}, next)
	})
})
