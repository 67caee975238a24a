// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package server_test

import (
	"net/http"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/tokenwarden/tokenwarden/proxy/attribute"
	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/proxy/cache"
)

// attributesDoc has two upstreams of two provider families, and keys of two tenants,
// teams, users and environments.
const attributesDoc = `
upstreams:
- {name: default, url: UPSTREAM, provider: openai}
- {name: claude-up, url: UPSTREAM, provider: anthropic, models: [claude]}
api_keys:
- {name: alice, key_sha256: HASH(alice), user: alice, team: research, tenant: team-a, environment: production}
- {name: bob, key_sha256: HASH(bob), user: bob, team: support, tenant: team-b, environment: staging}
rate_limiting:
  budget_division: {replicas: 1}
  rules:
`

// attrCase is one attribute: a value of it, a request that holds that value, and one
// that holds another.
type attrCase struct {
	attr, value string
	a, b        func(h *harness) reply
}

func chatWith(key string, hdr ...string) func(h *harness) reply {
	return func(h *harness) reply {
		return h.do("POST", "/v1/chat/completions", key, `{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}],"max_tokens":5}`, hdr...)
	}
}

func aliceChat(body string) func(h *harness) reply {
	return func(h *harness) reply { return h.do("POST", "/v1/chat/completions", "sk-alice", body) }
}

func messages(key string) func(h *harness) reply {
	return func(h *harness) reply {
		return h.do("POST", "/v1/messages", key, `{"model":"claude","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`)
	}
}

var attrCases = []attrCase{
	{"tenant", "team-a", chatWith("sk-alice"), chatWith("sk-bob")},
	{"api_key", "alice", chatWith("sk-alice"), chatWith("sk-bob")},
	{"user", "alice", chatWith("sk-alice"), chatWith("sk-bob")},
	{"team", "research", chatWith("sk-alice"), chatWith("sk-bob")},
	{"model", "gpt-4o", chatWith("sk-alice"), aliceChat(`{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}],"max_tokens":5}`)},
	{"provider", "anthropic", messages("sk-alice"), chatWith("sk-alice")},
	{"endpoint", "chat_completions", chatWith("sk-alice"), messages("sk-alice")},
	{"environment", "production", chatWith("sk-alice"), chatWith("sk-bob")},
	{"session", "s-1", chatWith("sk-alice", attribute.SessionHeader, "s-1"), chatWith("sk-alice", attribute.SessionHeader, "s-2")},
	{"agent", "planner", chatWith("sk-alice", attribute.AgentHeader, "planner"), chatWith("sk-alice", attribute.AgentHeader, "coder")},
	{"task", "t-1", chatWith("sk-alice", attribute.TaskHeader, "t-1"), chatWith("sk-alice", attribute.TaskHeader, "t-2")},
	{"run", "r-1", chatWith("sk-alice", attribute.RunHeader, "r-1"), chatWith("sk-alice", attribute.RunHeader, "r-2")},
	{"request_fingerprint", "", aliceChat(`{"model":"gpt-4o","messages":[{"role":"user","content":"same"}],"max_tokens":5}`),
		aliceChat(`{"model":"gpt-4o","messages":[{"role":"user","content":"other"}],"max_tokens":5}`)},
}

func attrEntries() []TableEntry {
	out := make([]TableEntry, 0, len(attrCases))
	for _, c := range attrCases {
		out = append(out, Entry(c.attr, c))
	}
	return out
}

var _ = Describe("Request attributes in rules", func() {
	DescribeTable("applies_when governs only the requests that hold the value", func(c attrCase) {
		value := c.value
		if c.attr == "request_fingerprint" {
			// The hash of the request as forwarded, as the response cache keys it for
			// alice's scope.
			value = (&cache.Request{Scope: "key:alice", Route: "/v1/chat/completions", Upstream: "default", Model: "gpt-4o",
				Header: http.Header{}, Body: []byte(`{"model":"gpt-4o","messages":[{"role":"user","content":"same"}],"max_tokens":5}`)}).Key().String()
		}
		h := newHarness(attributesDoc + `  - {name: only, dimension: global, amount: requests, applies_when: {` + c.attr + `: [` + value + `]},
     windows: [{limit: 1, rolling: {period: minute}}]}
`)
		Expect(c.a(h).code).To(Equal(200))
		second := c.a(h)
		Expect(second.code).To(Equal(429), "the second request with %s %s is the rule's second in its minute", c.attr, value)
		for range 3 {
			Expect(c.b(h).code).To(Equal(200), "another %s is not governed by the rule", c.attr)
		}
	}, attrEntries())

	DescribeTable("count_by keeps a counter per value", func(c attrCase) {
		h := newHarness(attributesDoc + `  - {name: each, dimension: global, amount: requests, count_by: ` + c.attr + `,
     windows: [{limit: 1, rolling: {period: minute}}]}
`)
		Expect(c.a(h).code).To(Equal(200))
		Expect(c.a(h).code).To(Equal(429), "the value's counter holds one request a minute")
		Expect(c.b(h).code).To(Equal(200), "another %s has a counter of its own", c.attr)
		Expect(c.b(h).code).To(Equal(429))
	}, attrEntries())

	It("stops a stuck agent resending one call: 20 identical requests a minute per key", func() {
		h := newHarness(attributesDoc + `  - {name: identical, dimension: api_key, amount: requests, count_by: request_fingerprint,
     windows: [{limit: 20, rolling: {period: minute}}]}
`)
		same := aliceChat(`{"model":"gpt-4o","messages":[{"role":"user","content":"retry me"}],"max_tokens":5}`)
		for i := range 20 {
			Expect(same(h).code).To(Equal(200), "identical request %d", i+1)
		}
		r := same(h)
		Expect(r.code).To(Equal(429))
		Expect(r.errorField("error", "details", "rule")).To(Equal("identical"))
		Expect(aliceChat(`{"model":"gpt-4o","messages":[{"role":"user","content":"something new"}],"max_tokens":5}`)(h).code).To(Equal(200),
			"another request of the same key is not identical")
		Expect(h.do("POST", "/v1/chat/completions", "sk-bob", `{"model":"gpt-4o","messages":[{"role":"user","content":"retry me"}],"max_tokens":5}`).code).
			To(Equal(200), "bob's identical body is bob's own")
		h.clock.Advance(3 * time.Second) // one request of 20 a minute
		Expect(same(h).code).To(Equal(200))
	})

	It("refuses an attribute header out of bounds with 400 when a rule reads it", func() {
		h := newHarness(attributesDoc + `  - {name: each-session, dimension: api_key, amount: requests, count_by: session,
     windows: [{limit: 100, rolling: {period: minute}}]}
`)
		r := chatWith("sk-alice", attribute.SessionHeader, strings.Repeat("x", attribute.MaxLength+1))(h)
		Expect(r.code).To(Equal(400))
		Expect(r.errorField("error", "code")).To(Equal("invalid_request_attribute"))
		Expect(r.errorField("error", "message")).To(ContainSubstring("X-Tokenwarden-Session-Id header is longer than 256 bytes"))
		Expect(chatWith("sk-alice", attribute.SessionHeader, "my session")(h).code).To(Equal(400))
		Expect(h.llm.Requests()).To(BeEmpty())
		Expect(chatWith("sk-alice")(h).code).To(Equal(200), "a request without the header is the key's one session without an id")
	})
})

var _ = Describe("A client that invents session ids", func() {
	It("escapes only the per-session budget, never its key's, user's, team's or tenant's", func() {
		h := newHarness(`
upstreams:
- {name: default, url: UPSTREAM}
api_keys:
- {name: alice, key_sha256: HASH(alice), user: ally, team: research, tenant: team-a}
- {name: bob, key_sha256: HASH(bob), user: ally, team: research, tenant: team-a}
- {name: carol, key_sha256: HASH(carol), user: carol, team: research, tenant: team-a}
- {name: root, key_sha256: HASH(root), user: root, team: support, tenant: team-a}
rate_limiting:
  budget_division: {replicas: 1}
  rules:
  - {name: each-session, dimension: api_key, count_by: session, amount: requests, windows: [{limit: 2, rolling: {period: minute}}]}
  - {name: key, dimension: api_key, amount: requests, windows: [{limit: 5, rolling: {period: minute}}]}
  - {name: user, dimension: user, amount: requests, windows: [{limit: 7, rolling: {period: minute}}]}
  - {name: team, dimension: team, amount: requests, windows: [{limit: 9, rolling: {period: minute}}]}
  - {name: tenant, dimension: tenant, amount: requests, windows: [{limit: 11, rolling: {period: minute}}]}
`)
		session := 0
		fresh := func(key string) reply {
			session++
			return chatWith(key, attribute.SessionHeader, "s-"+itoa(session))(h)
		}
		refusedBy := func(rule string) float64 { return counter(h.m.RuleRequests.WithLabelValues(rule, "minute", "refused")) }
		for _, step := range []struct {
			key, by  string
			admitted int
		}{{"sk-alice", "key", 5}, {"sk-bob", "user", 2}, {"sk-carol", "team", 2}, {"sk-root", "tenant", 2}} {
			for i := range step.admitted {
				Expect(fresh(step.key).code).To(Equal(200), "%s's request %d, each in a session of its own", step.key, i+1)
			}
			r := fresh(step.key)
			Expect(r.code).To(Equal(429), "%s's next new session is still under its %s budget", step.key, step.by)
			Expect(refusedBy(step.by)).To(Equal(1.0), "refused by the %s budget", step.by)
		}
		Expect(refusedBy("each-session")).To(BeZero(), "every session was new")

		h.clock.Advance(time.Minute)
		same := chatWith("sk-alice", attribute.SessionHeader, "s-same")
		Expect(same(h).code).To(Equal(200))
		Expect(same(h).code).To(Equal(200))
		r := same(h)
		Expect(r.code).To(Equal(429))
		Expect(r.errorField("error", "details", "rule")).To(Equal("each-session"), "one session holds two requests a minute")
	})
})

var _ = Describe("The bound on a key's distinct values", func() {
	It("counts the values beyond max_attribute_values in one overflow subject, counted and visible", func() {
		h := newHarness(attributesDoc + `  - {name: each-session, dimension: api_key, count_by: session, amount: requests, windows: [{limit: 1, rolling: {period: minute}}]}
  max_attribute_values: 3
`)
		for i := range 3 {
			Expect(chatWith("sk-alice", attribute.SessionHeader, "s-"+itoa(i))(h).code).To(Equal(200))
		}
		Expect(chatWith("sk-alice", attribute.SessionHeader, "s-3")(h).code).To(Equal(200), "the overflow subject's one request")
		r := chatWith("sk-alice", attribute.SessionHeader, "s-4")(h)
		Expect(r.code).To(Equal(429), "a fifth value shares the overflow subject")
		Expect(r.errorField("error", "details", "rule")).To(Equal("each-session"))
		Expect(counter(h.m.RuleOverflow.WithLabelValues("each-session", "minute"))).To(Equal(2.0))
		Expect(h.store.ValuesHeld("each-session", 0, "alice")).To(Equal(3))
		Expect(h.store.ValueBuckets()).To(Equal(int64(3)), "three sessions")
		Expect(h.store.LenOf(budget.APIKey, budget.Rolling)).To(Equal(int64(1)), "the overflow subject, among the key's subjects")
		Expect(chatWith("sk-bob", attribute.SessionHeader, "s-4")(h).code).To(Equal(200), "bob's values are his own")

		h.clock.Advance(time.Minute)
		Expect(chatWith("sk-alice", attribute.SessionHeader, "s-9")(h).code).To(Equal(200), "a new minute holds new values")
		Expect(h.store.ValuesHeld("each-session", 0, "alice")).To(Equal(1))
	})
})
