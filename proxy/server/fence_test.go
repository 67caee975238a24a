// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package server_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokenwarden/tokenwarden/proxy/budget/redisstore"
	"github.com/tokenwarden/tokenwarden/proxy/server"
	"github.com/tokenwarden/tokenwarden/test/fakellm"
	"github.com/tokenwarden/tokenwarden/test/redisserver"
)

var _ = Describe("The trust fence of durable budgets", func() {
	var rs *redisserver.Server
	BeforeEach(func() { rs = redisserver.Start(GinkgoT()) })

	doc := func(epoch string) string {
		return fmt.Sprintf(`
upstreams: [{name: default, url: UPSTREAM}]
models:
- {name: gpt-4o, price: {input: 1000, output: 1000}}
api_keys:
- {name: alice, key_sha256: HASH(alice), user: alice, team: research}
- {name: bob, key_sha256: HASH(bob), user: bob, team: research}
rate_limiting:
  storage: redis
  redis: {url: "%s", fallback_to_memory: true, epoch: "%s"}
  limits:
    per_api_key: {tokens_per_minute: 100000}
  rules:
  - {name: alice-dollars, dimension: api_key, subjects: [alice], amount: cost, windows: [{limit: 1, calendar: {every: month}}]}
`, rs.URL(), epoch)
	}
	admin := func(p *redisProxy) string {
		s := httptest.NewServer(p.srv.AdminHandler(prometheus.NewRegistry()))
		DeferCleanup(s.Close)
		return s.URL
	}
	call := func(method, url, body string) (int, map[string]any, string) {
		GinkgoHelper()
		req, err := http.NewRequest(method, url, strings.NewReader(body))
		Expect(err).NotTo(HaveOccurred())
		resp, err := http.DefaultClient.Do(req)
		Expect(err).NotTo(HaveOccurred())
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		var v map[string]any
		_ = json.Unmarshal(b, &v)
		return resp.StatusCode, v, string(b)
	}
	epochOf := func(adminURL string) (epoch string, fenced bool) {
		GinkgoHelper()
		code, v, body := call("GET", adminURL+"/admin/durable", "")
		Expect(code).To(Equal(200), body)
		g := v["groups"].([]any)[0].(map[string]any)
		epoch, _ = g["epoch"].(string)
		fenced, _ = g["fenced"].(bool)
		return epoch, fenced
	}

	It("refuses durable budgets with 503 budget_recovering after Redis lost its data, and lifts on the attested balance", func() {
		h := newHarness(keysDoc)
		h.llm.Set(fakellm.Behaviour{InputTokens: 21, OutputTokens: 10})
		prefix := fmt.Sprint("f", redisPrefixes.Add(1))
		a := newRedisProxy(h, rs.URL(), prefix, true, doc(""))
		aAdmin := admin(a)
		ask := via(h, a.url)
		Expect(ask("sk-alice", 10).code).To(Equal(200), "a brand-new Redis: an epoch is created, nothing is fenced")
		epoch, fenced := epochOf(aAdmin)
		Expect(epoch).NotTo(BeEmpty())
		Expect(fenced).To(BeFalse())
		b := newRedisProxy(h, rs.URL(), prefix, true, doc(epoch)) // the epoch the control plane recorded
		bAdmin := admin(b)
		askB := via(h, b.url)
		Expect(askB("sk-alice", 10).code).To(Equal(200))

		Expect(rs.Restart()).To(Succeed()) // without persistence: every counter is gone
		var r reply
		Eventually(func() int { r = ask("sk-alice", 10); return r.code }).WithTimeout(5 * time.Second).WithPolling(20 * time.Millisecond).Should(Equal(503))
		Expect(r.errorField("error", "code")).To(Equal("budget_recovering"))
		Expect(r.errorField("error", "type")).To(Equal("server_error"))
		Expect(r.header.Get("Retry-After")).To(Equal("30"))
		Expect(counter(a.m.DurableFences.WithLabelValues("api_key"))).To(BeNumerically(">=", 1))
		_, fenced = epochOf(aAdmin)
		Expect(fenced).To(BeTrue())
		Expect(ask("sk-bob", 10).code).To(Equal(200), "bob has only rolling budgets: unaffected")
		msg := h.doAt(a.url, "POST", "/v1/messages", "sk-alice", `{"model":"gpt-4o","max_tokens":10,"messages":[{"role":"user","content":"hi"}]}`)
		Expect(msg.code).To(Equal(503))
		Expect(msg.errorField("type")).To(Equal("error"), "in the Anthropic shape on an Anthropic route")
		Expect(msg.errorField("error", "type")).To(Equal("overloaded_error"))
		Expect(askB("sk-alice", 10).code).To(Equal(503), "every replica is fenced at its first durable admission")

		for _, bad := range []struct{ body, want string }{
			{`{"mode":"forget"}`, `mode: want "restore" or "adopt"`},
			{`{"mode":"restore"}`, "balances: required with mode restore"},
			{`{"mode":"restore","balances":[{"rule":"nope","subject":"alice","spent":1}]}`, `balances[0]: rule "nope": no durable rule`},
			{`{"mode":"restore","balances":[{"rule":"alice-dollars","spent":1}]}`, `balances[0]: rule "alice-dollars": subject: a api_key rule's counter needs one`},
			{`{"mode":"restore","balances":[{"rule":"alice-dollars","subject":"alice","spent":-1}]}`, "spent: -1 is below zero"},
		} {
			code, _, body := call("POST", aAdmin+"/admin/durable/attest", bad.body)
			Expect(code).To(Equal(400), bad.body)
			Expect(body).To(ContainSubstring(bad.want))
		}
		Expect(ask("sk-alice", 10).code).To(Equal(503), "a refused attestation lifts nothing")

		// The billing export says alice spent $0.90 this month.
		code, v, body := call("POST", aAdmin+"/admin/durable/attest",
			`{"mode":"restore","balances":[{"rule":"alice-dollars","window":"calendar_month","subject":"alice","spent":0.9}]}`)
		Expect(code).To(Equal(200), body)
		Expect(v["restored"]).To(BeEquivalentTo(1))
		next := v["epoch"].(string)
		Expect(next).NotTo(Equal(epoch))
		refused := ask("sk-alice", 100)
		Expect(refused.code).To(Equal(429), "the restored $0.90 counts: a $0.121 reservation does not fit in the $0.10 left")
		Expect(refused.errorField("error", "details", "rule")).To(Equal("alice-dollars"))
		Expect(ask("sk-alice", 10).code).To(Equal(200), "$0.031 fits")
		_, fenced = epochOf(aAdmin)
		Expect(fenced).To(BeFalse())

		Expect(askB("sk-alice", 10).code).To(Equal(503), "the other replica waits for its config to name the new epoch")
		Expect(b.srv.Apply([]byte(h.render(doc(next))), "test")).Error().NotTo(HaveOccurred())
		Expect(askB("sk-alice", 10).code).To(Equal(200))
		got, fenced := epochOf(bAdmin)
		Expect(got).To(Equal(next))
		Expect(fenced).To(BeFalse())
	})

	DescribeTable("a fenced budget's 503 says what lifts the fence",
		func(ledgerAttests bool, want, never string) {
			h := newHarness(keysDoc)
			p := newRedisProxyOpts(h, rs.URL(), fmt.Sprint("f", redisPrefixes.Add(1)), true, doc(""),
				redisstore.CheckOptions{}, server.Options{LedgerAttests: ledgerAttests})
			ask := via(h, p.url)
			Expect(ask("sk-alice", 10).code).To(Equal(200))
			Expect(p.store.Client().FlushAll(context.Background()).Err()).To(Succeed())
			r := ask("sk-alice", 10)
			Expect(r.code).To(Equal(503))
			Expect(r.errorField("error", "code")).To(Equal("budget_recovering"))
			Expect(r.errorField("error", "message")).To(ContainSubstring(want))
			Expect(r.errorField("error", "message")).NotTo(ContainSubstring(never))
		},
		Entry("a fleet that attests from its spend ledger on its own", true,
			"until the fleet attests its balance from its spend ledger, once every replica's spool is flushed", "administrator"),
		Entry("a fleet without one: an administrator", false,
			"until an administrator restores or attests its balance", "spend ledger"),
	)

	DescribeTable("a store check fences durable budgets only in enforce mode",
		func(mode string, want int) {
			Expect(rs.Client().Do(context.Background(), "CONFIG", "SET", "maxmemory-policy", "allkeys-lru").Err()).To(Succeed())
			h := newHarness(keysDoc)
			h.llm.Set(fakellm.Behaviour{InputTokens: 21, OutputTokens: 10})
			p := newRedisProxyWith(h, rs.URL(), fmt.Sprint("f", redisPrefixes.Add(1)), true, doc(""),
				redisstore.CheckOptions{Mode: mode, Interval: -1})
			p.store.CheckStore(context.Background())
			ask := via(h, p.url)
			r := ask("sk-alice", 10)
			Expect(r.code).To(Equal(want))
			Expect(ask("sk-bob", 10).code).To(Equal(200), "rolling budgets are never fenced by a store check")
			code, v, body := call("GET", admin(p)+"/admin/durable", "")
			Expect(code).To(Equal(200), body)
			g := v["groups"].([]any)[0].(map[string]any)
			Expect(g["store_checks"]).To(ContainElement(map[string]any{"check": "maxmemory_policy", "result": "fail",
				"detail": rs.Addr() + ": maxmemory-policy is allkeys-lru, want noeviction"}))
			Expect(g["fenced"]).To(BeNil(), "not a lost epoch")
			if want == 503 {
				Expect(r.errorField("error", "code")).To(Equal("budget_recovering"))
				Expect(r.errorField("error", "message")).To(ContainSubstring("failed a safety check"))
				Expect(g["store_fence"]).To(HavePrefix("maxmemory_policy: "))
			} else {
				Expect(g["store_fence"]).To(BeNil())
			}
		},
		Entry("report: reported, admitted", redisstore.CheckReport, 200),
		Entry("enforce: 503 budget_recovering naming no lost state", redisstore.CheckEnforce, 503),
	)

	It("adopts what Redis holds when attested so, after a flush", func() {
		h := newHarness(keysDoc)
		p := newRedisProxy(h, rs.URL(), fmt.Sprint("f", redisPrefixes.Add(1)), true, doc(""))
		ask, adminURL := via(h, p.url), admin(p)
		Expect(ask("sk-alice", 10).code).To(Equal(200))
		Expect(p.store.Client().FlushAll(context.Background()).Err()).To(Succeed())
		Expect(ask("sk-alice", 10).code).To(Equal(503))
		code, _, body := call("POST", adminURL+"/admin/durable/attest", `{"mode":"adopt"}`)
		Expect(code).To(Equal(200), body)
		Expect(ask("sk-alice", 10).code).To(Equal(200))
	})
})
