// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package server_test

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"io"
	"net/http"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/onsi/gomega/types"

	"github.com/tokenwarden/tokenwarden/test/fakellm"
)

// attack is one hostile request (or hostile upstream answer) and what it must leave
// in the caller's minute bucket.
type attack struct {
	llm fakellm.Behaviour
	// down: the upstream refuses connections.
	down bool
	// path and body default to a non-streamed chat completion (hostileInput input
	// tokens estimated, 100 output tokens reserved).
	path, body string
	header     []string
	// leaveAfter, when positive, reads that many content deltas of the stream and
	// disconnects.
	leaveAfter int
	// charged is the tokens the bucket keeps once the hold has ended.
	charged types.GomegaMatcher
	// check asserts more on the answer the client got and what the backend received.
	check func(h *harness, r reply)
}

const (
	hostileChat   = `{"model":"m","messages":[{"role":"user","content":"hello there"}],"max_tokens":100}`
	hostileStream = `{"model":"m","stream":true,"max_tokens":1000,"messages":[{"role":"user","content":"hello there"}]}`
	// hostileInput and hostileStreamInput are the input estimates of those bodies:
	// keys, strings, the ceiling's number and the message's floor (estimation.md).
	hostileInput       = 20
	hostileStreamInput = hostileInput + 2 // the "stream" key
	// pythonEncodings is what the Python SDKs accept.
	pythonEncodings = "gzip, deflate"
)

var usage100and30 = fakellm.Behaviour{InputTokens: 100, OutputTokens: 30}

func with(b fakellm.Behaviour, edit func(*fakellm.Behaviour)) fakellm.Behaviour {
	edit(&b)
	return b
}

// chargedExactly is a bucket that kept exactly n tokens.
func chargedExactly(n float64) types.GomegaMatcher { return BeNumerically("~", n, 0.01) }

// forwardedAs checks the path the backend received.
func forwardedAs(path string) func(h *harness, r reply) {
	return func(h *harness, r reply) {
		reqs := h.llm.Requests()
		Expect(reqs).To(HaveLen(1))
		Expect(reqs[0].Path).To(Equal(path))
		Expect(reqs[0].RawPath).To(Equal(path), "the path on the wire is the canonical one")
	}
}

// gotCompressed checks that the client got the compressed bytes it asked for, whole.
func gotCompressed(h *harness, r reply) {
	Expect(r.code).To(Equal(200))
	Expect(r.header.Get("Content-Encoding")).To(Equal("gzip"))
	zr, err := gzip.NewReader(bytes.NewReader(r.body))
	Expect(err).NotTo(HaveOccurred())
	plain, err := io.ReadAll(zr)
	Expect(err).NotTo(HaveOccurred())
	Expect(plain).To(ContainSubstring(`"completion_tokens":30`))
	Expect(h.llm.Requests()[0].Header.Get("Accept-Encoding")).To(Equal(pythonEncodings))
}

// path is an attack through a spelling of a charged path.
func path(p, forwarded string) attack {
	return attack{llm: usage100and30, path: p, charged: chargedExactly(130), check: forwardedAs(forwarded)}
}

var _ = Describe("Hostile clients", func() {
	DescribeTable("no request gets tokens it did not pay for",
		func(a attack) {
			h := newHarness(streamDoc)
			h.llm.Set(a.llm)
			if a.down {
				h.backend.Close()
			}
			p, body := a.path, a.body
			if p == "" {
				p = "/v1/chat/completions"
			}
			if body == "" {
				body = hostileChat
			}
			var r reply
			if a.leaveAfter > 0 {
				r = h.leaveAfter(p, body, a.leaveAfter, a.header...)
			} else {
				r = h.send(p, body, a.header...)
			}
			Eventually(func() float64 {
				return counter(h.m.Settlements.WithLabelValues("settled")) + counter(h.m.Settlements.WithLabelValues("released"))
			}).Should(Equal(1.0), "the hold ended once")
			Expect(60000 - minuteLevel(h)()).To(a.charged)
			if a.check != nil {
				a.check(h, r)
			}
		},

		// Compressed answers.
		Entry("a gzip answer, asked for as the Python SDKs do, is charged its usage",
			attack{llm: with(usage100and30, func(b *fakellm.Behaviour) { b.Encoding = "gzip" }), header: []string{"Accept-Encoding", pythonEncodings},
				charged: chargedExactly(130), check: gotCompressed}),
		Entry("a deflate (zlib) answer is charged its usage",
			attack{llm: with(usage100and30, func(b *fakellm.Behaviour) { b.Encoding = "deflate" }), header: []string{"Accept-Encoding", "deflate"},
				charged: chargedExactly(130)}),
		Entry("a raw deflate answer labelled deflate is charged its usage",
			attack{llm: with(usage100and30, func(b *fakellm.Behaviour) { b.Encoding = "deflate-raw" }), header: []string{"Accept-Encoding", "deflate"},
				charged: chargedExactly(130)}),
		Entry("a gzip stream is charged its usage",
			attack{llm: with(usage100and30, func(b *fakellm.Behaviour) { b.Encoding = "gzip" }), body: hostileStream,
				header: []string{"Accept-Encoding", pythonEncodings}, charged: chargedExactly(130)}),
		Entry("asking for br and zstd gets them removed from what the upstream is offered",
			attack{llm: usage100and30, header: []string{"Accept-Encoding", "br, zstd;q=0.9, gzip;q=0.5"}, charged: chargedExactly(130),
				check: func(h *harness, r reply) {
					Expect(h.llm.Requests()[0].Header.Get("Accept-Encoding")).To(Equal("gzip;q=0.5"))
				}}),
		Entry("an answer in an encoding the proxy cannot decode is charged its whole reservation",
			attack{llm: with(usage100and30, func(b *fakellm.Behaviour) { b.Encoding = "br" }), header: []string{"Accept-Encoding", "br"},
				charged: chargedExactly(hostileInput + 100)}),
		Entry("an answer labelled gzip that is not gzip is charged its whole reservation",
			attack{llm: with(usage100and30, func(b *fakellm.Behaviour) { b.Header = map[string]string{"Content-Encoding": "gzip"} }),
				header: []string{"Accept-Encoding", "gzip"}, charged: chargedExactly(hostileInput + 100)}),

		// Huge answers.
		Entry("an answer over 8 MiB is charged its usage",
			attack{llm: with(usage100and30, func(b *fakellm.Behaviour) { b.PadBytes = 9 << 20 }), charged: chargedExactly(130)}),
		Entry("a gzip answer that decompresses to 64 MiB is charged its usage",
			attack{llm: with(usage100and30, func(b *fakellm.Behaviour) { b.Encoding, b.PadBytes = "gzip", 64<<20 }),
				header: []string{"Accept-Encoding", "gzip"}, charged: chargedExactly(130)}),
		Entry("a Responses stream whose response.completed line is over 1 MiB is charged its usage",
			attack{llm: with(usage100and30, func(b *fakellm.Behaviour) { b.PadBytes = 2 << 20 }), path: "/v1/responses",
				body: `{"model":"m","stream":true,"max_output_tokens":1000,"input":"hello there"}`, charged: chargedExactly(130)}),
		Entry("an Anthropic stream whose message_delta line is over 1 MiB is charged its usage",
			attack{llm: with(usage100and30, func(b *fakellm.Behaviour) { b.PadBytes = 2 << 20 }), path: "/v1/messages", body: hostileStream,
				charged: chargedExactly(130)}),

		// Answers cut or without usage.
		Entry("a stream the client leaves after 5 deltas, before the usage, is charged the input estimate plus the deltas it carried",
			attack{llm: fakellm.Behaviour{InputTokens: 100, OutputTokens: 500, ChunkDelay: 50 * time.Millisecond}, body: hostileStream, leaveAfter: 5,
				charged: And(BeNumerically(">=", hostileStreamInput+5*2), BeNumerically("<", hostileStreamInput+25*2))}),
		Entry("a gzip stream the client leaves after 5 deltas is charged the input estimate plus the deltas it carried",
			attack{llm: fakellm.Behaviour{InputTokens: 100, OutputTokens: 500, ChunkDelay: 50 * time.Millisecond, Encoding: "gzip"}, body: hostileStream,
				header: []string{"Accept-Encoding", pythonEncodings}, leaveAfter: 5,
				charged: And(BeNumerically(">=", hostileStreamInput+5*2), BeNumerically("<", hostileStreamInput+25*2))}),
		Entry("a stream the upstream cuts after 3 deltas is charged the input estimate plus the deltas it carried",
			attack{llm: fakellm.Behaviour{InputTokens: 100, OutputTokens: 50, CutAfter: 3}, body: hostileStream, charged: chargedExactly(hostileStreamInput + 3*2)}),
		Entry("a 2xx without usage is charged the input estimate plus the output it carries",
			// 20 times "word " less the last space: 99 bytes, 25 tokens.
			attack{llm: fakellm.Behaviour{OutputTokens: 20, OmitUsage: true}, charged: chargedExactly(hostileInput + 25)}),

		// No output: released.
		Entry("an upstream 500 is released", attack{llm: fakellm.Behaviour{Status: 500}, charged: chargedExactly(0)}),
		Entry("an unreachable upstream is released", attack{down: true, charged: chargedExactly(0)}),
		Entry("a stream the upstream cuts before its first delta is released",
			attack{llm: fakellm.Behaviour{InputTokens: 100, OutputTokens: 50, CutAtStart: true}, path: "/v1/messages", body: hostileStream,
				charged: chargedExactly(0)}),

		// Paths an upstream normalises to a charged route.
		Entry("a leading double slash is charged and forwarded canonical", path("//v1/chat/completions", "/v1/chat/completions")),
		Entry("an inner double slash is charged and forwarded canonical", path("/v1//chat/completions", "/v1/chat/completions")),
		Entry("a dot segment is charged and forwarded canonical", path("/v1/chat/./completions", "/v1/chat/completions")),
		Entry("a dot-dot segment is charged and forwarded canonical", path("/v1/chat/x/../completions", "/v1/chat/completions")),
		Entry("a dot-dot above the root is charged and forwarded canonical", path("/../v1/chat/completions", "/v1/chat/completions")),
		Entry("a trailing slash is charged and forwarded canonical", path("/v1/chat/completions/", "/v1/chat/completions")),
		Entry("an encoded slash is charged and forwarded canonical", path("/v1/chat%2Fcompletions", "/v1/chat/completions")),
		Entry("an encoded letter is charged and forwarded canonical", path("/v1/%63hat/completions", "/v1/chat/completions")),
		Entry("an encoded dot segment is charged and forwarded canonical", path("/v1/chat/%2e%2E/chat/completions", "/v1/chat/completions")),
		Entry("upper case is charged and forwarded canonical", path("/V1/Chat/Completions", "/v1/chat/completions")),
		Entry("a double slash after /anthropic is charged and forwarded canonical", path("/anthropic//v1/messages", "/v1/messages")),

		// Headers.
		Entry("the provider's rate limit headers on a 200 never reach the client: only the proxy's own describe budgets",
			attack{llm: with(usage100and30, func(b *fakellm.Behaviour) {
				b.Header = map[string]string{"X-Ratelimit-Remaining-Tokens": "999999", "X-Ratelimit-Limit-Requests": "10000",
					"Anthropic-Ratelimit-Tokens-Remaining": "999999", "Anthropic-Ratelimit-Unified-Status": "allowed",
					"Retry-After": "0", "Retry-After-Ms": "0", "RateLimit-Policy": `"default";q=100;w=60`, "X-Request-Id": "req_1"}
			}), charged: chargedExactly(130), check: func(h *harness, r reply) {
				Expect(r.code).To(Equal(200))
				Expect(r.header.Get("X-Ratelimit-Remaining-Tokens")).To(Equal("59880"), "the proxy's own: 60000 less the 120 reserved")
				for _, k := range []string{"X-Ratelimit-Limit-Requests", "Anthropic-Ratelimit-Tokens-Remaining", "Anthropic-Ratelimit-Unified-Status",
					"Retry-After", "Retry-After-Ms", "Ratelimit-Policy"} {
					Expect(r.header.Values(k)).To(BeEmpty(), k)
				}
				Expect(r.header.Get("X-Request-Id")).To(Equal("req_1"), "other headers pass")
			}}),
		Entry("an upstream 429 keeps its Retry-After for the client but not the provider's quota headers",
			attack{llm: fakellm.Behaviour{Status: 429, Header: map[string]string{"Retry-After": "7", "Retry-After-Ms": "7000",
				"X-Ratelimit-Remaining-Requests": "0", "Anthropic-Ratelimit-Requests-Remaining": "0"}},
				charged: chargedExactly(0), check: func(h *harness, r reply) {
					Expect(r.code).To(Equal(429))
					Expect(r.header.Get("Retry-After")).To(Equal("7"))
					Expect(r.header.Get("Retry-After-Ms")).To(Equal("7000"))
					Expect(r.header.Values("X-Ratelimit-Remaining-Requests")).To(BeEmpty())
					Expect(r.header.Values("Anthropic-Ratelimit-Requests-Remaining")).To(BeEmpty())
				}}),
	)
})

// leaveAfter sends a streamed request, reads n content deltas (decompressing a gzip
// answer itself) and goes away.
func (h *harness) leaveAfter(path, body string, n int, hdr ...string) reply {
	GinkgoHelper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, "POST", h.front.URL+path, strings.NewReader(body))
	Expect(err).NotTo(HaveOccurred())
	req.Header.Set("Authorization", "Bearer sk-alice")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	Expect(err).NotTo(HaveOccurred())
	defer resp.Body.Close()
	var rd io.Reader = resp.Body
	if resp.Header.Get("Content-Encoding") == "gzip" {
		rd, err = gzip.NewReader(resp.Body)
		Expect(err).NotTo(HaveOccurred())
	}
	sc := bufio.NewScanner(rd)
	seen := 0
	for seen < n && sc.Scan() {
		if strings.Contains(sc.Text(), `"word "`) {
			seen++
		}
	}
	Expect(seen).To(Equal(n))
	return reply{code: resp.StatusCode, header: resp.Header}
}

// send posts a request and reads the answer as far as it goes: a stream the upstream
// cuts ends in an error the client sees.
func (h *harness) send(path, body string, hdr ...string) reply {
	GinkgoHelper()
	req, err := http.NewRequest("POST", h.front.URL+path, strings.NewReader(body))
	Expect(err).NotTo(HaveOccurred())
	req.Header.Set("Authorization", "Bearer sk-alice")
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return reply{}
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return reply{code: resp.StatusCode, header: resp.Header, body: b}
}
