// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package server_test

import (
	"bytes"
	"compress/gzip"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/test/fakellm"
)

const cacheDoc = keysDoc + `  limits:
    per_api_key: {tokens_per_minute: 6000}
cache: {storage: memory, max_entry_bytes: 65536}
`

const chatBody = `{"model":"gpt-4o","messages":[{"role":"user","content":"hello there"}],"max_tokens":100}`

// ended waits until n requests the cache saw have ended: their answers are stored,
// and their calls take no more waiters.
func (h *harness) ended(n int) {
	GinkgoHelper()
	Eventually(func() float64 {
		sum := 0.0
		for _, r := range []string{"hit", "miss", "coalesced", "bypass"} {
			sum += counter(h.m.Cache.Requests.WithLabelValues("other", r))
		}
		return sum
	}).Should(BeNumerically(">=", n))
}

func gzipped(s string) string {
	var b bytes.Buffer
	zw := gzip.NewWriter(&b)
	_, _ = zw.Write([]byte(s))
	_ = zw.Close()
	return b.String()
}

var _ = Describe("The response cache", func() {
	It("a cache hit releases its input and output hold: it charges no tokens, makes no backend call, and replays the answer", func() {
		h := newHarness(cacheDoc)
		h.llm.Set(fakellm.Behaviour{InputTokens: 10, OutputTokens: 20, Header: map[string]string{"X-Request-Id": "req_first", "Openai-Organization": "org-first"}})
		first := h.do("POST", "/v1/chat/completions", "sk-alice", chatBody)
		Expect(first.code).To(Equal(200))
		Expect(first.header.Get("X-Tokenwarden-Cache")).To(Equal("miss"))
		Eventually(func() float64 { return h.level(budget.TokensMinute, budget.APIKey, "alice", 6000) }).Should(BeNumerically("~", 6000-30, 0.01))
		released := counter(h.m.Settlements.WithLabelValues("released"))

		hit := h.do("POST", "/v1/chat/completions", "sk-alice", chatBody)
		Expect(hit.code).To(Equal(200))
		Expect(hit.header.Get("X-Tokenwarden-Cache")).To(Equal("hit"))
		Expect(hit.header.Get("Age")).To(Equal("0"))
		Expect(hit.body).To(Equal(first.body))
		Expect(h.llm.Requests()).To(HaveLen(1), "no backend call")
		Expect(hit.header.Get("X-Request-Id")).To(BeEmpty(), "never the first caller's upstream request id")
		Expect(hit.header.Get("Openai-Organization")).To(BeEmpty())
		Expect(hit.header.Get("X-Ratelimit-Tokens-Remaining")).To(Equal("5847"), "the caller's own budget: 5970 less this request's hold of 123")
		Consistently(func() float64 { return h.level(budget.TokensMinute, budget.APIKey, "alice", 6000) }, 50*time.Millisecond).
			Should(BeNumerically("~", 6000-30, 0.01), "the hit's hold of input and output was released, not settled")
		Expect(counter(h.m.Settlements.WithLabelValues("released"))).To(Equal(released + 1))
		Expect(counter(h.m.Settlements.WithLabelValues("settled"))).To(Equal(1.0))
		Expect(counter(h.m.KeyUsage.WithLabelValues("alice", "output"))).To(Equal(20.0), "usage counts the backend's answer once")
		Expect(counter(h.m.Cache.Requests.WithLabelValues("other", "hit"))).To(Equal(1.0))
		Expect(counter(h.m.Cache.SavedTokens.WithLabelValues("other", "output"))).To(Equal(20.0))

		h.clock.Advance(42 * time.Second)
		Expect(h.do("POST", "/v1/chat/completions", "sk-alice", chatBody).header.Get("Age")).To(Equal("42"))
		h.clock.Advance(5 * time.Minute)
		Expect(h.do("POST", "/v1/chat/completions", "sk-alice", chatBody).header.Get("X-Tokenwarden-Cache")).To(Equal("miss"), "past the time to live")
	})

	It("still counts a hit in the request limits", func() {
		h := newHarness(keysDoc + `  limits:
    per_api_key: {requests_per_second: 1, burst_capacity: 3}
cache: {storage: memory}
`)
		Expect(h.do("POST", "/v1/chat/completions", "sk-alice", chatBody).header.Get("X-Tokenwarden-Cache")).To(Equal("miss"))
		h.ended(1)
		Expect(h.do("POST", "/v1/chat/completions", "sk-alice", chatBody).header.Get("X-Tokenwarden-Cache")).To(Equal("hit"))
		Expect(h.do("POST", "/v1/chat/completions", "sk-alice", chatBody).header.Get("X-Tokenwarden-Cache")).To(Equal("hit"))
		Expect(h.do("POST", "/v1/chat/completions", "sk-alice", chatBody).code).To(Equal(http.StatusTooManyRequests))
	})

	It("replays a stream as the events it was", func() {
		h := newHarness(cacheDoc)
		body := `{"model":"gpt-4o","stream":true,"messages":[{"role":"user","content":"hi"}]}`
		first := h.do("POST", "/v1/chat/completions", "sk-alice", body)
		Expect(first.header.Get("Content-Type")).To(HavePrefix("text/event-stream"))
		h.ended(1)
		hit := h.do("POST", "/v1/chat/completions", "sk-alice", body)
		Expect(hit.header.Get("X-Tokenwarden-Cache")).To(Equal("hit"))
		Expect(hit.header.Get("Content-Type")).To(HavePrefix("text/event-stream"))
		Expect(string(hit.body)).To(Equal(string(first.body)))
		Expect(h.llm.Requests()).To(HaveLen(1))
	})

	It("a coalesced pair settles once and releases once", func() {
		h := newHarness(cacheDoc)
		h.llm.Set(fakellm.Behaviour{InputTokens: 10, OutputTokens: 20, Latency: 300 * time.Millisecond})
		var wg sync.WaitGroup
		replies := make([]reply, 2)
		for i := range replies {
			wg.Add(1)
			go func() {
				defer GinkgoRecover()
				defer wg.Done()
				if i == 1 {
					time.Sleep(50 * time.Millisecond) // the second arrives while the first is in flight
				}
				replies[i] = h.do("POST", "/v1/chat/completions", "sk-alice", chatBody)
			}()
		}
		wg.Wait()
		Expect(h.llm.Requests()).To(HaveLen(1), "one backend call for the pair")
		Expect(replies[0].code).To(Equal(200))
		Expect(replies[1].code).To(Equal(200))
		Expect(replies[0].header.Get("X-Tokenwarden-Cache")).To(Equal("miss"))
		Expect(replies[1].header.Get("X-Tokenwarden-Cache")).To(Equal("coalesced"))
		Expect(replies[1].body).To(Equal(replies[0].body))
		Eventually(func() float64 { return counter(h.m.Settlements.WithLabelValues("settled")) }).Should(Equal(1.0))
		Expect(counter(h.m.Settlements.WithLabelValues("released"))).To(Equal(1.0))
		Eventually(func() float64 { return h.level(budget.TokensMinute, budget.APIKey, "alice", 6000) }).
			Should(BeNumerically("~", 6000-30, 0.01), "the leader's usage is the pair's only charge")
		Expect(counter(h.m.Cache.Requests.WithLabelValues("other", "coalesced"))).To(Equal(1.0))
	})

	It("keeps a leader's upstream call for its waiter when the leader's client leaves, and settles the leader on the whole answer", func() {
		h := newHarness(keysDoc + "  limits:\n    per_api_key: {tokens_per_minute: 60000}\ncache: {storage: memory}\n")
		h.llm.Set(fakellm.Behaviour{InputTokens: 10, OutputTokens: 10, ChunkDelay: 30 * time.Millisecond})
		body := `{"model":"gpt-4o","stream":true,"messages":[{"role":"user","content":"hi"}]}`
		leader := h.post("/v1/chat/completions", "sk-alice", body)
		Expect(leader.Header.Get("X-Tokenwarden-Cache")).To(Equal("miss"))
		waiter := make(chan reply, 1)
		go func() {
			defer GinkgoRecover()
			waiter <- h.do("POST", "/v1/chat/completions", "sk-alice", body)
		}()
		time.Sleep(60 * time.Millisecond) // it joins while the stream runs
		_ = leader.Body.Close()           // the leader's client leaves
		var w reply
		Eventually(waiter, 5*time.Second).Should(Receive(&w))
		Expect(w.header.Get("X-Tokenwarden-Cache")).To(Equal("coalesced"))
		Expect(string(w.body)).To(HaveSuffix("data: [DONE]\n\n"), "the waiter got the whole stream")
		Expect(h.llm.Requests()).To(HaveLen(1))
		Eventually(func() float64 { return counter(h.m.Settlements.WithLabelValues("settled")) }).Should(Equal(1.0), "the leader settles on the whole answer")
		Expect(counter(h.m.Settlements.WithLabelValues("released"))).To(Equal(1.0), "the waiter is released")
	})

	Describe("and the limits for agents", func() {
		const doc = `
upstreams:
- {name: default, url: UPSTREAM}
api_keys:
- {name: alice, key_sha256: HASH(alice), max_in_flight: 1, run_token_budget: 100000, run_max_steps: 2}
rate_limiting:
  budget_division: {replicas: 1}
  limits:
    per_api_key: {tokens_per_minute: 100000}
cache: {storage: memory}
`
		It("serves a hit to a key whose one slot in flight a long request holds", func() {
			h := newHarness(doc)
			Expect(h.do("POST", "/v1/chat/completions", "sk-alice", chatBody).header.Get("X-Tokenwarden-Cache")).To(Equal("miss"))
			h.ended(1)
			h.llm.Set(fakellm.Behaviour{InputTokens: 10, OutputTokens: 20, Latency: 3 * time.Second})
			long := make(chan reply, 1)
			go func() {
				defer GinkgoRecover()
				long <- h.do("POST", "/v1/chat/completions", "sk-alice", strings.Replace(chatBody, "hello there", "a long one", 1))
			}()
			Eventually(h.llm.Requests).Should(HaveLen(2), "the long request holds alice's one slot")

			for range 3 {
				r := h.do("POST", "/v1/chat/completions", "sk-alice", chatBody)
				Expect(r.code).To(Equal(200), string(r.body))
				Expect(r.header.Get("X-Tokenwarden-Cache")).To(Equal("hit"))
			}
			other := h.do("POST", "/v1/chat/completions", "sk-alice", strings.Replace(chatBody, "hello there", "another", 1))
			Expect(other.code).To(Equal(http.StatusTooManyRequests), "a request that is not a hit still needs the slot")
			Expect(other.errorField("error", "code")).To(Equal("in_flight_limit"))
			Expect((<-long).code).To(Equal(200))
		})

		It("counts a hit as one step of its agent run, with no tokens", func() {
			h := newHarness(doc)
			run := []string{"X-Tokenwarden-Run-Id", "r1"}
			Expect(h.do("POST", "/v1/chat/completions", "sk-alice", chatBody, run...).header.Get("X-Tokenwarden-Cache")).To(Equal("miss"))
			h.ended(1)
			Expect(h.do("POST", "/v1/chat/completions", "sk-alice", chatBody, run...).header.Get("X-Tokenwarden-Cache")).To(Equal("hit"))
			r := h.do("POST", "/v1/chat/completions", "sk-alice", chatBody, run...)
			Expect(r.code).To(Equal(http.StatusTooManyRequests), "the run's two steps are the miss and the hit")
			Expect(r.errorField("error", "code")).To(Equal("run_steps_exceeded"))
		})
	})

	It("gives a waiter the whole of an answer it also stores", func() {
		h := newHarness(cacheDoc)
		for _, pad := range []int{30000, 40000} {
			h.llm.Set(fakellm.Behaviour{InputTokens: 10, OutputTokens: 20, PadBytes: pad, Latency: 200 * time.Millisecond})
			body := strings.Replace(chatBody, "hello there", strconv.Itoa(pad), 1)
			replies := make([]reply, 2)
			var wg sync.WaitGroup
			for i := range replies {
				wg.Add(1)
				go func() {
					defer GinkgoRecover()
					defer wg.Done()
					if i == 1 {
						time.Sleep(50 * time.Millisecond)
					}
					replies[i] = h.do("POST", "/v1/chat/completions", "sk-alice", body)
				}()
			}
			wg.Wait()
			Expect(replies[1].header.Get("X-Tokenwarden-Cache")).To(Equal("coalesced"))
			Expect(replies[1].body).To(Equal(replies[0].body))
			Expect(len(replies[0].body)).To(BeNumerically(">", pad))
		}
		h.ended(4)
		Expect(h.do("POST", "/v1/chat/completions", "sk-alice", strings.Replace(chatBody, "hello there", "30000", 1)).header.Get("X-Tokenwarden-Cache")).To(Equal("hit"))
	})

	Describe("as an attack surface", func() {
		DescribeTable("never serves one caller's answer to a request that is not the same",
			func(doc string, second func(h *harness) reply, want string) {
				h := newHarness(keysDoc + "  limits:\n    per_api_key: {tokens_per_minute: 60000}\n" + doc)
				h.llm.Set(fakellm.Behaviour{InputTokens: 10, OutputTokens: 20, Header: map[string]string{"X-Request-Id": "req_alice", "Set-Cookie": "session=alice"}})
				Expect(h.do("POST", "/v1/chat/completions", "sk-alice", chatBody, "Anthropic-Version", "2023-06-01").code).To(Equal(200))
				h.ended(1)
				r := second(h)
				Expect(r.header.Get("X-Tokenwarden-Cache")).To(Equal(want))
				if want == "hit" {
					Expect(h.llm.Requests()).To(HaveLen(1))
					Expect(r.header.Get("X-Request-Id")).To(BeEmpty())
					Expect(r.header.Values("Set-Cookie")).To(BeEmpty(), "nothing of the caller that caused the answer")
				} else {
					Expect(h.llm.Requests()).To(HaveLen(2))
				}
			},
			Entry("the same request is the same", "cache: {storage: memory}\n",
				func(h *harness) reply {
					return h.do("POST", "/v1/chat/completions", "sk-alice", chatBody, "Anthropic-Version", "2023-06-01")
				}, "hit"),
			Entry("the same body from another key", "cache: {storage: memory}\n",
				func(h *harness) reply {
					return h.do("POST", "/v1/chat/completions", "sk-bob", chatBody, "Anthropic-Version", "2023-06-01")
				}, "miss"),
			Entry("the same body from a key of the same team, under a team scope", "cache: {storage: memory, scope: team}\n",
				func(h *harness) reply {
					return h.do("POST", "/v1/chat/completions", "sk-bob", chatBody, "Anthropic-Version", "2023-06-01")
				}, "hit"),
			Entry("the same body gzipped is the same request", "cache: {storage: memory}\n",
				func(h *harness) reply {
					return h.do("POST", "/v1/chat/completions", "sk-alice", gzipped(chatBody), "Content-Encoding", "gzip", "Anthropic-Version", "2023-06-01")
				}, "hit"),
			Entry("the same body gzipped from another key", "cache: {storage: memory}\n",
				func(h *harness) reply {
					return h.do("POST", "/v1/chat/completions", "sk-bob", gzipped(chatBody), "Content-Encoding", "gzip", "Anthropic-Version", "2023-06-01")
				}, "miss"),
			Entry("another model", "cache: {storage: memory}\n",
				func(h *harness) reply {
					return h.do("POST", "/v1/chat/completions", "sk-alice", strings.Replace(chatBody, "gpt-4o", "gpt-4o-mini", 1), "Anthropic-Version", "2023-06-01")
				}, "miss"),
			Entry("another route", "cache: {storage: memory}\n",
				func(h *harness) reply {
					return h.do("POST", "/v1/messages", "sk-alice", chatBody, "Anthropic-Version", "2023-06-01")
				}, "miss"),
			Entry("another API version header", "cache: {storage: memory}\n",
				func(h *harness) reply {
					return h.do("POST", "/v1/chat/completions", "sk-alice", chatBody, "Anthropic-Version", "2024-01-01")
				}, "miss"),
			Entry("a query added", "cache: {storage: memory}\n",
				func(h *harness) reply {
					return h.do("POST", "/v1/chat/completions?api-version=2", "sk-alice", chatBody, "Anthropic-Version", "2023-06-01")
				}, "miss"),
			Entry("Cache-Control: no-cache asks for a fresh answer", "cache: {storage: memory}\n",
				func(h *harness) reply {
					return h.do("POST", "/v1/chat/completions", "sk-alice", chatBody, "Anthropic-Version", "2023-06-01", "Cache-Control", "no-cache")
				}, "miss"),
			Entry("Cache-Control: no-store bypasses the cache", "cache: {storage: memory}\n",
				func(h *harness) reply {
					return h.do("POST", "/v1/chat/completions", "sk-alice", chatBody, "Anthropic-Version", "2023-06-01", "Cache-Control", "no-store")
				}, "bypass"),
			Entry("a model the cache does not serve", "cache: {storage: memory, models: [claude]}\n",
				func(h *harness) reply {
					return h.do("POST", "/v1/chat/completions", "sk-alice", chatBody, "Anthropic-Version", "2023-06-01")
				}, "bypass"),
		)

		DescribeTable("stores no answer that would poison the entry",
			func(b fakellm.Behaviour, body string) {
				h := newHarness(cacheDoc)
				h.llm.Set(b)
				first := h.post("/v1/chat/completions", "sk-alice", body)
				_, _ = io.Copy(io.Discard, first.Body) // the whole answer, or as much as a cut one has
				_ = first.Body.Close()
				h.ended(1)
				h.llm.Set(fakellm.Behaviour{InputTokens: 10, OutputTokens: 20})
				r := h.do("POST", "/v1/chat/completions", "sk-alice", body)
				Expect(r.header.Get("X-Tokenwarden-Cache")).To(Equal("miss"), "the second request went to the backend")
				Expect(r.code).To(Equal(200))
				Expect(h.llm.Requests()).To(HaveLen(2))
			},
			Entry("an error answer", fakellm.Behaviour{Status: 500}, chatBody),
			Entry("a rate-limited answer", fakellm.Behaviour{Status: 429}, chatBody),
			Entry("a stream cut before its end", fakellm.Behaviour{InputTokens: 10, OutputTokens: 20, CutAfter: 3},
				`{"model":"gpt-4o","stream":true,"messages":[{"role":"user","content":"hi"}]}`),
			Entry("an answer larger than max_entry_bytes", fakellm.Behaviour{InputTokens: 10, OutputTokens: 20, PadBytes: 100000}, chatBody),
			Entry("an answer in a coding the proxy cannot read", fakellm.Behaviour{InputTokens: 10, OutputTokens: 20, Encoding: "br"}, chatBody),
		)

		It("never caches a stateful Responses call", func() {
			h := newHarness(cacheDoc)
			body := `{"model":"gpt-4o","input":"hi"}`
			Expect(h.do("POST", "/v1/responses", "sk-alice", body).header.Get("X-Tokenwarden-Cache")).To(Equal("bypass"))
			Expect(h.do("POST", "/v1/responses", "sk-alice", body).header.Get("X-Tokenwarden-Cache")).To(Equal("bypass"))
			Expect(h.llm.Requests()).To(HaveLen(2))
			stateless := `{"model":"gpt-4o","input":"hi","store":false}`
			Expect(h.do("POST", "/v1/responses", "sk-alice", stateless).header.Get("X-Tokenwarden-Cache")).To(Equal("miss"))
			h.ended(3)
			Expect(h.do("POST", "/v1/responses", "sk-alice", stateless).header.Get("X-Tokenwarden-Cache")).To(Equal("hit"))
		})
	})

	It("serves no hit to another team, nor to a key without a team, under a team scope", func() {
		h := newHarness(`
upstreams: [{name: default, url: UPSTREAM}]
api_keys:
- {name: alice, key_sha256: HASH(alice), team: research}
- {name: bob, key_sha256: HASH(bob), team: support}
- {name: carol, key_sha256: HASH(carol)}
cache: {storage: memory, scope: team}
`)
		Expect(h.do("POST", "/v1/chat/completions", "sk-alice", chatBody).header.Get("X-Tokenwarden-Cache")).To(Equal("miss"))
		h.ended(1)
		Expect(h.do("POST", "/v1/chat/completions", "sk-bob", chatBody).header.Get("X-Tokenwarden-Cache")).To(Equal("miss"))
		h.ended(2)
		Expect(h.do("POST", "/v1/chat/completions", "sk-carol", chatBody).header.Get("X-Tokenwarden-Cache")).NotTo(Equal("hit"))
		h.ended(3)
		Expect(h.do("POST", "/v1/chat/completions", "sk-carol", chatBody).header.Get("X-Tokenwarden-Cache")).NotTo(Equal("hit"),
			"a key without a team has no team scope: nothing is stored for it")
		Expect(h.llm.Requests()).To(HaveLen(4))
	})

	It("neither stores nor coalesces an anonymous caller's answers under the api_key scope", func() {
		h := newHarness(keysDoc + "auth: {mode: optional}\ncache: {storage: memory}\n")
		for i := range 2 {
			r := h.do("POST", "/v1/chat/completions", "", chatBody)
			Expect(r.code).To(Equal(200))
			Expect(r.header.Get("X-Tokenwarden-Cache")).NotTo(Equal("hit"))
			h.ended(i + 1)
		}
		Expect(h.llm.Requests()).To(HaveLen(2))
		Expect(h.do("POST", "/v1/chat/completions", "sk-alice", chatBody).header.Get("X-Tokenwarden-Cache")).To(Equal("miss"),
			"a key finds nothing an anonymous caller left")
	})

	It("is off unless configured: no cache header, every request forwarded", func() {
		h := newHarness(keysDoc)
		Expect(h.do("POST", "/v1/chat/completions", "sk-alice", chatBody).header.Get("X-Tokenwarden-Cache")).To(BeEmpty())
		Expect(h.do("POST", "/v1/chat/completions", "sk-alice", chatBody).header.Values("X-Tokenwarden-Cache")).To(BeEmpty())
		Expect(h.llm.Requests()).To(HaveLen(2))
	})
})
