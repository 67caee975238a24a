// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package cache_test

import (
	"net/http"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/tokenwarden/tokenwarden/proxy/cache"
)

func baseRequest() cache.Request {
	return cache.Request{
		Scope:    "key:alice",
		Route:    "/v1/chat/completions",
		Upstream: "default",
		Model:    "gpt-4o",
		Query:    "",
		Header: http.Header{
			"Authorization": {"Bearer sk-alice"},
			"User-Agent":    {"OpenAI/Python 1.0"},
			"Openai-Beta":   {"assistants=v2"},
		},
		Body: []byte(`{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}`),
	}
}

var _ = Describe("The cache key", func() {
	DescribeTable("a request that must not be answered with another's answer has another key",
		func(change func(r *cache.Request)) {
			a, b := baseRequest(), baseRequest()
			change(&b)
			Expect(b.Key().Hash).NotTo(Equal(a.Key().Hash))
		},
		Entry("the same body from another API key", func(r *cache.Request) { r.Scope = "key:mallory" }),
		Entry("the same body for another team", func(r *cache.Request) { r.Scope = "team:other" }),
		Entry("another serving model", func(r *cache.Request) { r.Model = "gpt-4o-mini" }),
		Entry("the same model served by another upstream", func(r *cache.Request) { r.Upstream = "azure" }),
		Entry("an upstream's end moved into the model", func(r *cache.Request) {
			r.Upstream, r.Model = "defaul", "tgpt-4o"
		}),
		Entry("another route", func(r *cache.Request) { r.Route = "/v1/completions" }),
		Entry("another query", func(r *cache.Request) { r.Query = "api-version=2" }),
		Entry("another body byte", func(r *cache.Request) { r.Body = append(r.Body[:len(r.Body)-1:len(r.Body)-1], ' ', '}') }),
		Entry("another OpenAI-Beta", func(r *cache.Request) { r.Header.Set("OpenAI-Beta", "assistants=v1") }),
		Entry("an anthropic-beta added", func(r *cache.Request) { r.Header.Set("anthropic-beta", "prompt-caching-2024-07-31") }),
		Entry("another anthropic-version", func(r *cache.Request) { r.Header.Set("anthropic-version", "2023-01-01") }),
		Entry("another OpenAI-Organization", func(r *cache.Request) { r.Header.Set("OpenAI-Organization", "org-2") }),
		Entry("another OpenAI-Project", func(r *cache.Request) { r.Header.Set("OpenAI-Project", "proj-2") }),
		Entry("another Accept", func(r *cache.Request) { r.Header.Set("Accept", "text/event-stream") }),
		Entry("a vary header present but empty rather than absent", func(r *cache.Request) { r.Header.Set("Anthropic-Version", "") }),
		Entry("a scope's end moved into the route", func(r *cache.Request) {
			r.Scope, r.Route = "key:alic", "e/v1/chat/completions"
		}),
		Entry("a model's end moved into the query", func(r *cache.Request) {
			r.Model, r.Query = "gpt-4", "o"
		}),
	)

	DescribeTable("a request that asks the same thing has the same key",
		func(change func(r *cache.Request)) {
			a, b := baseRequest(), baseRequest()
			change(&b)
			Expect(b.Key()).To(Equal(a.Key()))
		},
		Entry("another credential of the same scope", func(r *cache.Request) { r.Header.Set("Authorization", "Bearer sk-alice-2") }),
		Entry("another SDK version", func(r *cache.Request) { r.Header.Set("User-Agent", "OpenAI/Python 2.0") }),
		Entry("a tracing header", func(r *cache.Request) {
			r.Header.Set("Traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
		}),
		Entry("a vary header's name in lower case", func(r *cache.Request) {
			r.Header.Del("OpenAI-Beta")
			r.Header.Add("openai-beta", "assistants=v2")
		}),
		Entry("spaces around a vary header's value", func(r *cache.Request) { r.Header.Set("OpenAI-Beta", " assistants=v2 ") }),
	)

	It("reads the query's parameters in any order, and a list header on one line or several", func() {
		a, b := baseRequest(), baseRequest()
		a.Query, b.Query = "a=1&b=2", "b=2&a=1"
		a.Header.Set("Anthropic-Beta", "x, y")
		b.Header.Del("Anthropic-Beta")
		b.Header.Add("Anthropic-Beta", "x")
		b.Header.Add("Anthropic-Beta", "y")
		Expect(b.Key()).To(Equal(a.Key()))
	})

	It("names every header it reads as a parsed request's header map holds it", func() {
		for _, name := range cache.VaryHeaders {
			Expect(name).To(Equal(http.CanonicalHeaderKey(name)))
		}
	})

	It("carries the scope and model that a purge selects by", func() {
		r := baseRequest()
		k := r.Key()
		Expect(k.Scope).To(Equal("key:alice"))
		Expect(k.Model).To(Equal("gpt-4o"))
		Expect(k.String()).To(HaveLen(64))
	})

	DescribeTable("the caller's scope",
		func(scope, key, team, want string, ok bool) {
			got, has := cache.ScopeFor(scope, key, team)
			Expect(has).To(Equal(ok))
			Expect(got).To(Equal(want))
		},
		Entry("by default an API key's answers are its own", "", "alice", "t/a", "key:alice", true),
		Entry("an anonymous caller has no key scope: nothing is cached for it", cache.ScopeAPIKey, "", "", "", false),
		Entry("a team scope shares a team's answers", cache.ScopeTeam, "alice", "t/a", "team:t/a", true),
		Entry("a key without a team has no team scope", cache.ScopeTeam, "alice", "", "", false),
		Entry("a fleet scope shares every answer", cache.ScopeFleet, "", "", "fleet", true),
	)
})
