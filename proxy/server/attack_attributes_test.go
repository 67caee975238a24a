// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package server_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/tokenwarden/tokenwarden/proxy/attribute"
	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/proxy/server"
	"github.com/tokenwarden/tokenwarden/test/redisserver"
)

// neighboursDoc has tenant team-a's three keys and tenant team-b's root, under a
// platform rule per session and one per key; the bucket maps hold 12 each and a key
// 4 values a minute, as 100,000 and 1,000 are for 100 keys.
const neighboursDoc = `
upstreams: [{name: default, url: UPSTREAM}]
api_keys:
- {name: alice, key_sha256: HASH(alice), team: research, tenant: team-a}
- {name: bob, key_sha256: HASH(bob), team: research, tenant: team-a}
- {name: carol, key_sha256: HASH(carol), team: research, tenant: team-a}
- {name: root, key_sha256: HASH(root), team: ops, tenant: team-b}
rate_limiting:
  budget_division: {replicas: 1}
  max_buckets: 12
  max_attribute_values: 4
  rules:
  - {name: each-session, dimension: api_key, count_by: session, amount: requests, windows: [{limit: 100, rolling: {period: minute}}]}
  - {name: key, dimension: api_key, amount: requests, windows: [{limit: 1, rolling: {period: minute}}]}
`

var _ = Describe("A tenant whose keys send many session ids", func() {
	It("never fills the bucket map its neighbour's budgets live in: the neighbour's per-key budget still refuses", func() {
		h := newHarness(neighboursDoc)
		for _, key := range []string{"sk-alice", "sk-bob", "sk-carol"} {
			for i := range 4 {
				chatWith(key, attribute.SessionHeader, "s-"+itoa(i))(h) // the second on is refused by "key", and still counted
			}
		}
		Expect(h.store.LenOf(budget.APIKey, budget.Rolling)).To(BeNumerically("<=", 12), "the map stays bounded")

		Expect(chatWith("sk-root")(h).code).To(Equal(http.StatusOK))
		r := chatWith("sk-root")(h)
		Expect(r.code).To(Equal(http.StatusTooManyRequests), "team-b's key holds one request a minute, whatever team-a sent")
		Expect(r.errorField("error", "details", "rule")).To(Equal("key"))
		Expect(counter(h.m.BucketMapFullVec.WithLabelValues("api_key", "rolling"))).To(BeZero(), "no subject's bucket was left out")

		// The values' buckets are bounded apart: a new value once they are full counts in
		// its key's overflow subject, never unbounded and never failing open.
		h.clock.Advance(2 * 60e9)
		before := counter(h.m.RuleOverflow.WithLabelValues("each-session", "minute"))
		Expect(chatWith("sk-root", attribute.SessionHeader, "r-1")(h).code).To(Equal(http.StatusOK))
		Expect(counter(h.m.RuleOverflow.WithLabelValues("each-session", "minute"))-before).To(Equal(1.0),
			"the values' map is full of team-a's sessions: root's new one is its overflow subject's")
	})
})

// sendRaw sends r as built, its headers' names as written.
func sendRaw(r *http.Request) reply {
	GinkgoHelper()
	resp, err := http.DefaultClient.Do(r)
	Expect(err).NotTo(HaveOccurred())
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	Expect(err).NotTo(HaveOccurred())
	out := reply{code: resp.StatusCode, header: resp.Header, body: b}
	_ = json.Unmarshal(b, &out.json)
	return out
}

var _ = Describe("Attribute headers a client bends", func() {
	doc := attributesDoc + `  - {name: each-session, dimension: api_key, count_by: session, amount: requests, windows: [{limit: 1, rolling: {period: minute}}]}
`
	It("is one header whatever its case, and twice is refused, on either route, in the route's shape", func() {
		h := newHarness(doc)
		req := func(path, body string, hdr func(http.Header)) reply {
			GinkgoHelper()
			r, err := http.NewRequest("POST", h.front.URL+path, strings.NewReader(body))
			Expect(err).NotTo(HaveOccurred())
			r.Header.Set("Authorization", "Bearer sk-alice")
			r.Header.Set("x-api-key", "sk-alice")
			r.Header.Set("Content-Type", "application/json")
			hdr(r.Header)
			return sendRaw(r)
		}
		chat := func(hdr func(http.Header)) reply {
			return req("/v1/chat/completions", `{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}],"max_tokens":5}`, hdr)
		}
		raw := func(name, v string) func(http.Header) { return func(hh http.Header) { hh[name] = append(hh[name], v) } }

		Expect(chat(raw("x-tokenwarden-session-id", "s-1")).code).To(Equal(http.StatusOK))
		Expect(chat(raw("X-TOKENWARDEN-SESSION-ID", "s-1")).code).To(Equal(http.StatusTooManyRequests), "any case is the one header")
		Expect(chat(raw(attribute.SessionHeader, "  s-1  ")).code).To(Equal(http.StatusTooManyRequests), "spaces around a value are not the value's")

		twice := chat(func(hh http.Header) { hh[attribute.SessionHeader] = []string{"s-2", "s-3"} })
		Expect(twice.code).To(Equal(http.StatusBadRequest))
		Expect(twice.errorField("error", "code")).To(Equal("invalid_request_attribute"))
		Expect(chat(func(hh http.Header) { hh[attribute.SessionHeader] = []string{"", "s-2"} }).code).To(Equal(http.StatusBadRequest), "an empty line is a line")
		Expect(chat(raw(attribute.SessionHeader, "s-2, s-3")).code).To(Equal(http.StatusBadRequest), "a list is not one value")

		Expect(chat(raw(attribute.SessionHeader, strings.Repeat("a", attribute.MaxLength))).code).To(Equal(http.StatusOK), "256 bytes is a value")
		Expect(chat(raw(attribute.SessionHeader, strings.Repeat("a", attribute.MaxLength+1))).code).To(Equal(http.StatusBadRequest))
		Expect(chat(raw(attribute.SessionHeader, "sessión")).code).To(Equal(http.StatusBadRequest), "UTF-8 beyond ASCII")

		m := req("/v1/messages", `{"model":"claude","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`,
			func(hh http.Header) { hh[attribute.SessionHeader] = []string{"a", "b"} })
		Expect(m.code).To(Equal(http.StatusBadRequest))
		Expect(m.errorField("type")).To(Equal("error"), "Anthropic's shape: %s", m.body)
		Expect(m.errorField("error", "type")).To(Equal("invalid_request_error"))
		Expect(m.errorField("error", "message")).To(ContainSubstring("X-Tokenwarden-Session-Id header is sent more than once"))
		Expect(h.llm.Requests()).To(HaveLen(2), "only the two requests admitted reached the backend")
	})
})

var _ = Describe("The request fingerprint a stuck agent resends", func() {
	const body = `{"model":"gpt-4o","messages":[{"role":"user","content":"retry me"}],"max_tokens":5}`
	doc := attributesDoc + `  - {name: identical, dimension: api_key, amount: requests, count_by: request_fingerprint,
     windows: [{limit: 3, rolling: {period: minute}}]}
`
	send := func(h *harness, b []byte, query string, hdr map[string]string) int {
		GinkgoHelper()
		r, err := http.NewRequest("POST", h.front.URL+"/v1/chat/completions"+query, bytes.NewReader(b))
		Expect(err).NotTo(HaveOccurred())
		r.Header.Set("Authorization", "Bearer sk-alice")
		r.Header.Set("Content-Type", "application/json")
		for k, v := range hdr {
			r.Header.Set(k, v)
		}
		return sendRaw(r).code
	}
	gz := func(s string) []byte {
		var b bytes.Buffer
		w := gzip.NewWriter(&b)
		_, _ = w.Write([]byte(s))
		Expect(w.Close()).To(Succeed())
		return b.Bytes()
	}

	It("is one call whatever the headers an SDK varies between retries, and whether the body came gzipped", func() {
		h := newHarness(doc)
		Expect(send(h, []byte(body), "", map[string]string{"X-Stainless-Retry-Count": "0", "Traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"})).To(Equal(200))
		Expect(send(h, []byte(body), "", map[string]string{"X-Stainless-Retry-Count": "1", "Idempotency-Key": "stainless-retry-1", "User-Agent": "OpenAI/Python 9.9"})).To(Equal(200))
		Expect(send(h, gz(body), "", map[string]string{"Content-Encoding": "gzip", "X-Stainless-Retry-Count": "2"})).To(Equal(200))
		Expect(send(h, []byte(body), "", map[string]string{"X-Request-Id": "another"})).To(Equal(http.StatusTooManyRequests),
			"the fourth identical call in a minute, however each was sent")
	})

	It("is the body byte for byte, as the cache compares it: another key order, spacing, stream flag or query is another request", func() {
		h := newHarness(doc)
		for range 3 {
			Expect(send(h, []byte(body), "", nil)).To(Equal(200))
		}
		Expect(send(h, []byte(body), "", nil)).To(Equal(http.StatusTooManyRequests))
		for _, other := range []struct{ what, body, query string }{
			{"keys in another order", `{"messages":[{"role":"user","content":"retry me"}],"model":"gpt-4o","max_tokens":5}`, ""},
			{"another spacing", `{"model": "gpt-4o", "messages":[{"role":"user","content":"retry me"}],"max_tokens":5}`, ""},
			{"the stream flag", `{"model":"gpt-4o","messages":[{"role":"user","content":"retry me"}],"max_tokens":5,"stream":false}`, ""},
			{"a query", body, "?attempt=2"},
		} {
			Expect(send(h, []byte(other.body), other.query, nil)).To(Equal(200), "%s is another request's counter", other.what)
		}
	})
})

var _ = Describe("The overflow subject's requests in flight", func() {
	var redis *redisserver.Server
	BeforeEach(func() { redis = redisserver.Start(GinkgoT()) })

	// overflowLeaks fills alice's three values, then sends new sessions through the
	// proxies at urls: two in flight in the overflow subject, a third refused by it, one
	// refused by a later budget and one whose client goes away; once all end, the
	// overflow subject holds no request in flight, on every proxy of srvs.
	overflowLeaks := func(h *harness, g *gate, urls []string, srvs []*server.Server) {
		out := make(chan sent, 8)
		for i, s := range []string{"s1", "s2", "s3", "new-1", "new-2"} {
			sendVia(context.Background(), urls[i%len(urls)], out, s, "sk-alice", session(s)...)
			Eventually(func() int { return len(g.order()) }).Should(Equal(i + 1))
		}
		last := urls[len(urls)-1]
		expectInFlightRefusal(sessionChat(h, last, "sk-alice", "new-3"), "a third new session shares the overflow's two")
		g.release()
		for range 5 {
			Expect((<-out).code).To(Equal(http.StatusOK))
		}
		big := h.doAt(last, "POST", "/v1/chat/completions", "sk-alice",
			`{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}],"max_tokens":5000}`, session("new-4")...)
		Expect(big.code).To(Equal(http.StatusTooManyRequests), "refused by alice-tokens after its slot was taken: %s", big.body)
		bad := h.doAt(last, "POST", "/v1/chat/completions", "sk-alice", fleetChat, attribute.SessionHeader, "new 5")
		Expect(bad.code).To(Equal(http.StatusBadRequest))

		hold := func() *gate {
			gt := &gate{next: h.llm, open: make(chan struct{})}
			DeferCleanup(gt.release)
			h.backend.Config.Handler = gt
			return gt
		}
		g2 := hold()
		ctx, cancel := context.WithCancel(context.Background())
		sendVia(ctx, urls[0], out, "gone", "sk-alice", session("new-6")...)
		Eventually(func() int { return len(g2.order()) }).Should(Equal(1))
		cancel()
		Expect((<-out).code).To(Equal(-1), "its client went away")
		g2.release()

		for _, srv := range srvs {
			Eventually(func() int64 { _, b := explainedInFlight(srv, "new-9"); return *b.InFlight }).Should(BeZero(),
				"the overflow subject gave back every slot")
			_, b := explainedInFlight(srv, "new-9")
			Expect(b.Overflow).To(BeTrue(), "new-9 is the overflow subject's")
		}
		g3 := hold()
		both := make(chan sent, 2)
		sendVia(context.Background(), urls[0], both, "n7", "sk-alice", session("new-7")...)
		sendVia(context.Background(), last, both, "n8", "sk-alice", session("new-8")...)
		Eventually(func() int { return len(g3.order()) }).Should(Equal(2), "the overflow subject's two slots are whole")
		g3.release()
		for range 2 {
			Expect((<-both).code).To(Equal(http.StatusOK))
		}
	}

	It("are all given back however they end, in memory", func() {
		h, g := gated(sessionInFlightDoc)
		overflowLeaks(h, g, []string{h.front.URL}, []*server.Server{h.srv})
	})

	It("are all given back however they end, across three proxies on one Redis", func() {
		h, g := gated(sessionInFlightDoc)
		prefix := fmt.Sprintf("overflow%d", redisPrefixes.Add(1))
		doc := fmt.Sprintf(fleetSessionInFlightDoc, redis.URL())
		var urls []string
		var srvs []*server.Server
		for range 3 {
			p := fleetProxy(h, redis.URL(), prefix, doc)
			urls, srvs = append(urls, p.url), append(srvs, p.srv)
		}
		overflowLeaks(h, g, urls, srvs)
	})
})
