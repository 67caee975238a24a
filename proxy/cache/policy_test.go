// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package cache_test

import (
	"net/http"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/tokenwarden/tokenwarden/proxy/cache"
	"github.com/tokenwarden/tokenwarden/proxy/estimate"
	"github.com/tokenwarden/tokenwarden/proxy/usage"
)

var _ = Describe("Cache-Control on a request", func() {
	DescribeTable("has RFC 9111's meanings",
		func(h http.Header, lookup, store bool) {
			d := cache.RequestDirectives(h)
			Expect(d.Lookup()).To(Equal(lookup), "lookup")
			Expect(d.Store()).To(Equal(store), "store")
		},
		Entry("none: look up and store", http.Header{}, true, true),
		Entry("no-cache: the fresh answer, stored", http.Header{"Cache-Control": {"no-cache"}}, false, true),
		Entry("no-store: neither looked up nor stored", http.Header{"Cache-Control": {"no-store"}}, false, false),
		Entry("directives are case-insensitive, in a list", http.Header{"Cache-Control": {"max-age=5, No-Store"}}, false, false),
		Entry("over several lines", http.Header{"Cache-Control": {"max-age=5", "no-cache"}}, false, true),
		Entry("Pragma: no-cache without Cache-Control is no-cache", http.Header{"Pragma": {"no-cache"}}, false, true),
		Entry("Pragma is ignored beside a Cache-Control", http.Header{"Pragma": {"no-cache"}, "Cache-Control": {"max-age=60"}}, true, true),
		Entry("an unknown directive changes nothing", http.Header{"Cache-Control": {"only-if-cached"}}, true, true),
	)

	It("takes max-age as the oldest entry the caller accepts", func() {
		d := cache.RequestDirectives(http.Header{"Cache-Control": {"max-age=30"}})
		Expect(d.Fresh(30 * time.Second)).To(BeTrue())
		Expect(d.Fresh(31 * time.Second)).To(BeFalse())
		Expect(cache.RequestDirectives(http.Header{}).Fresh(24 * time.Hour)).To(BeTrue())
		Expect(cache.RequestDirectives(http.Header{"Cache-Control": {"max-age=-3"}}).Fresh(24 * time.Hour)).To(BeTrue())
	})
})

var _ = Describe("Stateful calls", func() {
	DescribeTable("are never cached nor shared",
		func(route, body string, stateful bool) {
			est, err := estimate.Body([]byte(body))
			Expect(err).NotTo(HaveOccurred())
			Expect(cache.Stateful(route, est.State)).To(Equal(stateful))
		},
		Entry("a Responses call with store absent (the API stores by default)", "/v1/responses", `{"model":"m","input":"hi"}`, true),
		Entry("a Responses call with store true", "/v1/responses", `{"model":"m","input":"hi","store":true}`, true),
		Entry("a Responses call that continues a response", "/v1/responses", `{"model":"m","store":false,"previous_response_id":"resp_1"}`, true),
		Entry("a Responses call in a conversation", "/v1/responses", `{"model":"m","store":false,"conversation":"conv_1"}`, true),
		Entry("a Responses call in the background", "/v1/responses", `{"model":"m","store":false,"background":true}`, true),
		Entry("a Responses body that is not JSON", "/v1/responses", `{"model":`, true),
		Entry("a Responses call with store false is stateless", "/v1/responses", `{"model":"m","input":"hi","store":false,"previous_response_id":null}`, false),
		Entry("a chat completion is stateless", "/v1/chat/completions", `{"model":"m","messages":[]}`, false),
		Entry("an Anthropic message is stateless", "/v1/messages", `{"model":"m","messages":[]}`, false),
	)
})

var _ = Describe("The recorder", func() {
	complete := cache.Answer{
		Status: 200, Header: http.Header{"Content-Type": {"application/json"}, "X-Request-Id": {"req_alice"}},
		End: usage.Complete, Verdict: usage.Settle, Usage: usage.Usage{Input: 10, Output: 5, Found: true},
	}

	DescribeTable("never stores an answer that is not whole",
		func(change func(a *cache.Answer), reason string) {
			r := cache.NewRecorder(1<<10, false)
			_, _ = r.Write([]byte(`{"id":"x","usage":{}}`))
			a := complete
			a.Header = complete.Header.Clone()
			change(&a)
			e, why := r.Entry(a)
			Expect(e).To(BeZero())
			Expect(why).To(Equal(reason))
		},
		Entry("an error answer", func(a *cache.Answer) { a.Status = 500 }, cache.NotStoredStatus),
		Entry("a rate-limit answer", func(a *cache.Answer) { a.Status = 429 }, cache.NotStoredStatus),
		Entry("a redirect", func(a *cache.Answer) { a.Status = 304 }, cache.NotStoredStatus),
		Entry("a cut body", func(a *cache.Answer) { a.End = usage.Cut }, cache.NotStoredCut),
		Entry("a body that could not be decoded", func(a *cache.Answer) { a.End, a.Verdict = usage.Unreadable, usage.Reserve }, cache.NotStoredUnreadable),
		Entry("a body whose usage could not be read", func(a *cache.Answer) { a.Verdict = usage.Reserve }, cache.NotStoredUnreadable),
		Entry("an answer released as empty", func(a *cache.Answer) { a.Verdict = usage.Release }, cache.NotStoredUnreadable),
		Entry("a compressed body the proxy could not read", func(a *cache.Answer) { a.DecodeError = true }, cache.NotStoredEncoded),
		Entry("an answer that says no-store", func(a *cache.Answer) { a.Header.Set("Cache-Control", "private, no-store") }, cache.NotStoredNoStore),
	)

	It("stores a whole 2xx answer with its usage and Content-Type, and none of the upstream's other headers", func() {
		r := cache.NewRecorder(1<<10, false)
		_, _ = r.Write([]byte(`{"id":"x",`))
		_, _ = r.Write([]byte(`"usage":{}}`))
		a := complete
		a.Stored = time.Unix(100, 0)
		e, why := r.Entry(a)
		Expect(why).To(BeEmpty())
		Expect(string(e.Body)).To(Equal(`{"id":"x","usage":{}}`))
		Expect(e.ContentType).To(Equal("application/json"))
		Expect(e.Usage).To(Equal(complete.Usage))
		Expect(e.Stream()).To(BeFalse())
		Expect(e.Stored).To(Equal(time.Unix(100, 0)))
	})

	It("holds nothing of an answer larger than its bound, and never stores it", func() {
		r := cache.NewRecorder(64, false)
		_, _ = r.Write([]byte(strings.Repeat("a", 40)))
		n, err := r.Write([]byte(strings.Repeat("b", 40)))
		Expect(err).NotTo(HaveOccurred())
		Expect(n).To(Equal(40))
		_, _ = r.Write([]byte("c"))
		e, why := r.Entry(complete)
		Expect(e).To(BeZero())
		Expect(why).To(Equal(cache.NotStoredTooLarge))
	})

	It("keeps a stream's events as they were, however the bytes arrived", func() {
		events := []string{
			"event: message_start\ndata: {\"a\":1}\n\n",
			"data: {\"b\":2}\r\n\r\n",
			": comment\ndata: {\"c\":3}\n\n",
			"data: [DONE]\n\n",
		}
		whole := strings.Join(events, "")
		r := cache.NewRecorder(1<<10, true)
		for i := 0; i < len(whole); i += 7 { // chunks that split lines and events
			_, _ = r.Write([]byte(whole[i:min(i+7, len(whole))]))
		}
		a := complete
		a.Header = http.Header{"Content-Type": {"text/event-stream"}}
		e, why := r.Entry(a)
		Expect(why).To(BeEmpty())
		Expect(e.Stream()).To(BeTrue())
		var got []string
		Expect(e.EachEvent(func(p []byte) error { got = append(got, string(p)); return nil })).To(Succeed())
		Expect(got).To(Equal(events))
	})

	It("replays a stream's unterminated last event as one more event", func() {
		r := cache.NewRecorder(1<<10, true)
		_, _ = r.Write([]byte("data: 1\n\ndata: 2\n"))
		e, _ := r.Entry(complete)
		var got []string
		Expect(e.EachEvent(func(p []byte) error { got = append(got, string(p)); return nil })).To(Succeed())
		Expect(got).To(Equal([]string{"data: 1\n\n", "data: 2\n"}))
	})
})
