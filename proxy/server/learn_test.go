// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package server_test

import (
	"context"
	"net/http"
	"sync"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/tokenwarden/tokenwarden/test/fakellm"
)

const learnDoc = `
upstreams:
- name: default
  url: UPSTREAM
  capacity: {max_in_flight_requests: 4, learn: {min_in_flight_requests: 1, decrease: 0.25}}
api_keys:
- {name: bob, key_sha256: HASH(bob)}
`

// turnstile holds requests at the backend while shut, counting those that reached it
// since it last shut.
type turnstile struct {
	next    http.Handler
	mu      sync.Mutex
	arrived int
	open    chan struct{}
}

func newTurnstile(next http.Handler) *turnstile {
	t := &turnstile{next: next, open: make(chan struct{})}
	close(t.open)
	return t
}

func (t *turnstile) shut() {
	t.mu.Lock()
	t.arrived, t.open = 0, make(chan struct{})
	t.mu.Unlock()
}

func (t *turnstile) release() {
	t.mu.Lock()
	defer t.mu.Unlock()
	select {
	case <-t.open:
	default:
		close(t.open)
	}
}

func (t *turnstile) count() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.arrived
}

func (t *turnstile) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	t.mu.Lock()
	t.arrived++
	open := t.open
	t.mu.Unlock()
	select {
	case <-open:
	case <-r.Context().Done():
		return
	}
	t.next.ServeHTTP(w, r)
}

var _ = Describe("A learned capacity", func() {
	It("sends the backend fewer requests at once after its 429s, and more again as it answers", func() {
		h := newHarness(learnDoc)
		g := newTurnstile(h.llm)
		h.backend.Config.Handler = g
		DeferCleanup(g.release)
		// The backend is overloaded: its 429 lowers the bound from 4 to 1.
		h.llm.Set(fakellm.Behaviour{Status: http.StatusTooManyRequests})
		Expect(h.chat("sk-bob", 10).code).To(Equal(http.StatusTooManyRequests))
		h.llm.Set(fakellm.Behaviour{InputTokens: 10, OutputTokens: 20})

		// Three requests at once: one reaches the backend, the others wait their turn.
		g.shut()
		out := make(chan sent, 8)
		for _, name := range []string{"r1", "r2", "r3"} {
			send(context.Background(), h, out, name, "sk-bob")
		}
		Eventually(func() int { return g.count() }).Should(Equal(1))
		Consistently(func() int { return g.count() }, "100ms").Should(Equal(1))
		g.release()
		for range 3 {
			Expect((<-out).code).To(Equal(http.StatusOK))
		}

		// Three good answers raised the bound from 1 to 2 (1 + 1 + 1/2 + 1/2.5 ≈ 2.9):
		// of four requests at once, two reach the backend.
		g.shut()
		for _, name := range []string{"s1", "s2", "s3", "s4"} {
			send(context.Background(), h, out, name, "sk-bob")
		}
		Eventually(func() int { return g.count() }).Should(Equal(2))
		Consistently(func() int { return g.count() }, "100ms").Should(Equal(2))
		g.release()
		for range 4 {
			Expect((<-out).code).To(Equal(http.StatusOK))
		}
	})

	It("is refused without the in-flight request bound it starts from, naming the field", func() {
		h := newHarness(schedDoc)
		err := h.apply(`
upstreams:
- {name: default, url: UPSTREAM, capacity: {max_in_flight_tokens: 1000, learn: {decrease: 0.5}}}
`)
		Expect(err).To(MatchError(ContainSubstring("upstreams[0].capacity.learn")))
		err = h.apply(`
upstreams:
- {name: default, url: UPSTREAM, capacity: {max_in_flight_requests: 4, learn: {decrease: 1.5}}}
`)
		Expect(err).To(MatchError(ContainSubstring("upstreams[0].capacity.learn.decrease")))
	})
})
