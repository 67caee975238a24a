// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package cache_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/tokenwarden/tokenwarden/proxy/cache"
	"github.com/tokenwarden/tokenwarden/proxy/usage"
)

var sseHeader = http.Header{"Content-Type": {"text/event-stream"}, "X-Request-Id": {"req_leader"}}

// readAll reads a waiter's whole answer in the background.
func readAll(w *cache.Waiter) <-chan result {
	out := make(chan result, 1)
	go func() {
		var buf bytes.Buffer
		_, err := io.Copy(&buf, w)
		out <- result{body: buf.String(), err: err}
	}()
	return out
}

type result struct {
	body string
	err  error
}

var _ = Describe("Coalescing identical requests in flight", func() {
	var (
		g   *cache.Group
		k   cache.Key
		ctx context.Context
	)
	BeforeEach(func() {
		g = cache.NewGroup(1 << 10)
		k = keyOf("key:alice", "m", "same")
		ctx = context.Background()
	})

	It("gives the waiters the recorder's one copy of an answer it stores, and their own past the bound", func() {
		for _, size := range []int{900, 1500} { // within the group's and recorder's 1 KiB, and past it
			leader, _ := g.Join(ctx, k)
			_, waiter := g.Join(ctx, k)
			leader.Head(200, http.Header{"Content-Type": {"application/json"}})
			rec := cache.NewRecorder(1<<10, false)
			rec.Share(leader)
			want := strings.Repeat("a", size/3) + strings.Repeat("b", size/3) + strings.Repeat("c", size-2*(size/3))
			var got bytes.Buffer
			buf := make([]byte, 64)
			for _, chunk := range []string{want[:size/3], want[size/3 : 2*(size/3)], want[2*(size/3):]} {
				_, _ = rec.Write([]byte(chunk))
				for got.Len() < strings.Index(want, chunk)+len(chunk) { // the waiter keeps up
					n, err := waiter.Read(buf)
					Expect(err).NotTo(HaveOccurred())
					got.Write(buf[:n])
				}
			}
			e, why := rec.Entry(cache.Answer{Status: 200, Header: http.Header{}, End: usage.Complete, Verdict: usage.Settle})
			leader.Finish(true, usage.Usage{})
			rest, err := io.ReadAll(waiter)
			Expect(err).NotTo(HaveOccurred())
			got.Write(rest)
			Expect(got.String()).To(Equal(want), "the waiter reads the whole answer, %d bytes", size)
			if size <= 1<<10 {
				Expect(string(e.Body)).To(Equal(want), "the store keeps the same answer")
			} else {
				Expect(e).To(BeZero())
				Expect(why).To(Equal(cache.NotStoredTooLarge))
			}
			waiter.Leave()
		}
	})

	It("makes the first request the leader and the next a waiter that reads the leader's answer", func() {
		leader, w := g.Join(ctx, k)
		Expect(leader).NotTo(BeNil())
		Expect(w).To(BeNil())
		none, waiter := g.Join(ctx, k)
		Expect(none).To(BeNil())
		Expect(waiter).NotTo(BeNil())
		defer waiter.Leave()
		Expect(leader.Waiters()).To(Equal(1))

		other, _ := g.Join(ctx, keyOf("key:alice", "m", "different"))
		Expect(other).NotTo(BeNil(), "another key leads its own call")

		leader.Head(200, sseHeader)
		status, ct, err := waiter.Head()
		Expect(err).NotTo(HaveOccurred())
		Expect(status).To(Equal(200))
		Expect(ct).To(Equal("text/event-stream"), "the leader's Content-Type, and none of its other headers")
		got := readAll(waiter)
		_, _ = leader.Write([]byte("data: 1\n\n"))
		_, _ = leader.Write([]byte("data: 2\n\n"))
		leader.Finish(true, usage.Usage{Input: 7, Output: 3, Found: true})
		Eventually(got).Should(Receive(Equal(result{body: "data: 1\n\ndata: 2\n\n", err: nil})))
		Expect(waiter.Usage()).To(Equal(usage.Usage{Input: 7, Output: 3, Found: true}))
	})

	It("gives a late joiner the events so far, then the rest", func() {
		leader, _ := g.Join(ctx, k)
		leader.Head(200, sseHeader)
		_, _ = leader.Write([]byte("data: 1\n\n"))
		_, _ = leader.Write([]byte("data: 2\n\n"))
		_, late := g.Join(ctx, k)
		defer late.Leave()
		_, _, err := late.Head()
		Expect(err).NotTo(HaveOccurred())
		got := readAll(late)
		_, _ = leader.Write([]byte("data: 3\n\n"))
		leader.Finish(true, usage.Usage{})
		Eventually(got).Should(Receive(Equal(result{body: "data: 1\n\ndata: 2\n\ndata: 3\n\n"})))
	})

	It("takes a request that arrives after the answer ended as the leader of a new call", func() {
		leader, _ := g.Join(ctx, k)
		leader.Head(200, sseHeader)
		leader.Finish(true, usage.Usage{})
		again, w := g.Join(ctx, k)
		Expect(again).NotTo(BeNil())
		Expect(w).To(BeNil())
	})

	It("lets a slow waiter fall behind, and cuts it off past the buffer, without slowing the leader or a fast waiter", func() {
		leader, _ := g.Join(ctx, k)
		_, slow := g.Join(ctx, k)
		defer slow.Leave()
		_, fast := g.Join(ctx, k)
		defer fast.Leave()
		leader.Head(200, sseHeader)
		var mu sync.Mutex
		var fastGot bytes.Buffer
		fastDone := make(chan error, 1)
		go func() {
			p := make([]byte, 64)
			for {
				n, err := fast.Read(p)
				mu.Lock()
				fastGot.Write(p[:n])
				mu.Unlock()
				if err != nil {
					fastDone <- err
					return
				}
			}
		}()
		fastLen := func() int { mu.Lock(); defer mu.Unlock(); return fastGot.Len() }
		event := []byte("data: " + strings.Repeat("x", 90) + "\n\n")
		var want bytes.Buffer
		for range 100 { // 10 KB through a 1 KB buffer; the slow waiter reads nothing
			_, _ = leader.Write(event) // returns at once: nothing waits for the slow waiter
			want.Write(event)
			Eventually(fastLen).Should(Equal(want.Len()), "the fast waiter keeps up with an upstream's pace")
		}
		leader.Finish(true, usage.Usage{})
		Eventually(fastDone).Should(Receive(Equal(io.EOF)))
		Expect(fastGot.String()).To(Equal(want.String()))

		n, err := slow.Read(make([]byte, 1<<20))
		Expect(n).To(Equal(0))
		Expect(err).To(MatchError(cache.ErrCut))
	})

	It("takes no new joiner once the answer is larger than the buffer", func() {
		leader, _ := g.Join(ctx, k)
		leader.Head(200, sseHeader)
		_, _ = leader.Write(bytes.Repeat([]byte("x"), 2<<10))
		again, _ := g.Join(ctx, k)
		Expect(again).NotTo(BeNil(), "a joiner could not be given the answer's start")
		Expect(g.InFlight()).To(Equal(1))
	})

	It("gives the waiters what arrived, then a cut, when the leader's answer stops early", func() {
		leader, _ := g.Join(ctx, k)
		_, w := g.Join(ctx, k)
		defer w.Leave()
		leader.Head(200, sseHeader)
		_, _ = leader.Write([]byte("data: 1\n\n"))
		leader.Finish(false, usage.Usage{})
		Eventually(readAll(w)).Should(Receive(Equal(result{body: "data: 1\n\n", err: cache.ErrCut})))
	})

	DescribeTable("when the leader's upstream fails before the first byte, one waiter leads the next call and the others wait for it",
		func(fail func(c *cache.Call)) {
			leader, _ := g.Join(ctx, k)
			waiters := make([]*cache.Waiter, 3)
			for i := range waiters {
				_, waiters[i] = g.Join(ctx, k)
			}
			fail(leader)
			var next *cache.Call
			var again []*cache.Waiter
			for _, w := range waiters {
				_, _, err := w.Head()
				Expect(err).To(MatchError(cache.ErrLeaderFailed))
				w.Leave()
				c, w2 := g.Join(ctx, k)
				if c != nil {
					Expect(next).To(BeNil(), "one new leader")
					next = c
				} else {
					again = append(again, w2)
				}
			}
			Expect(next).NotTo(BeNil())
			Expect(again).To(HaveLen(2))
			next.Head(200, sseHeader)
			_, _ = next.Write([]byte("ok"))
			next.Finish(true, usage.Usage{})
			for _, w := range again {
				Eventually(readAll(w)).Should(Receive(Equal(result{body: "ok"})))
				w.Leave()
			}
		},
		Entry("no answer at all", func(c *cache.Call) { c.Fail() }),
		Entry("an error status, which is the leader's alone", func(c *cache.Call) { c.Head(503, http.Header{}) }),
		Entry("a rate-limit status", func(c *cache.Call) { c.Head(429, http.Header{"Retry-After": {"1"}}) }),
		Entry("an end before the head", func(c *cache.Call) { c.Finish(false, usage.Usage{}) }),
	)

	Describe("a leader whose client leaves", func() {
		It("keeps the upstream call going while a waiter reads", func() {
			leader, _ := g.Join(ctx, k)
			_, w := g.Join(ctx, k)
			client, leave := context.WithCancel(ctx)
			up := leader.Context(client, nil, nil)
			leave()
			Consistently(up.Done(), 50*time.Millisecond).ShouldNot(BeClosed())
			leader.Head(200, sseHeader)
			got := readAll(w)
			_, _ = leader.Write([]byte("all of it"))
			leader.Finish(true, usage.Usage{})
			Eventually(got).Should(Receive(Equal(result{body: "all of it"})))
			w.Leave()
		})

		It("ends the upstream call when no waiter is left", func() {
			leader, _ := g.Join(ctx, k)
			_, w := g.Join(ctx, k)
			client, leave := context.WithCancel(ctx)
			up := leader.Context(client, nil, nil)
			leave()
			Consistently(up.Done(), 20*time.Millisecond).ShouldNot(BeClosed())
			w.Leave()
			Eventually(up.Done()).Should(BeClosed())
		})

		It("ends it at once when it has no waiter", func() {
			leader, _ := g.Join(ctx, k)
			client, leave := context.WithCancel(ctx)
			up := leader.Context(client, nil, nil)
			leave()
			Eventually(up.Done()).Should(BeClosed())
		})
	})

	Describe("the leader's upstream context", func() {
		type key string

		It("carries the leader's values and the caller's, and never the leader's end", func() {
			leader, _ := g.Join(ctx, k)
			_, w := g.Join(ctx, k)
			client, leave := context.WithCancel(context.WithValue(ctx, key("trace"), "span"))
			up := leader.Context(client, key("state"), "request")
			Expect(up.Value(key("trace"))).To(Equal("span"))
			Expect(up.Value(key("state"))).To(Equal("request"))
			Expect(up.Value(key("other"))).To(BeNil())
			_, has := up.Deadline()
			Expect(has).To(BeFalse())
			leave()
			Consistently(up.Done(), 20*time.Millisecond).ShouldNot(BeClosed())
			Expect(up.Err()).NotTo(HaveOccurred())
			w.Leave()
			Eventually(up.Done()).Should(BeClosed())
			Expect(up.Err()).To(MatchError(context.Canceled))
		})

		It("outlives the call's end, so that the leader reads an answer it does not share, and then ends with the leader's client", func() {
			leader, _ := g.Join(ctx, k)
			client, leave := context.WithCancel(ctx)
			up := leader.Context(client, nil, nil)
			leader.Head(500, http.Header{})
			Consistently(up.Done(), 20*time.Millisecond).ShouldNot(BeClosed())
			leave()
			Eventually(up.Done()).Should(BeClosed())
			leader.Release()
		})

		It("ends the contexts a transport makes below it, through a value of another's, with no goroutine for each", func() {
			leader, _ := g.Join(ctx, k)
			client, leave := context.WithCancel(ctx)
			up := leader.Context(client, key("state"), "request")
			before := runtime.NumGoroutine()
			below := make([]context.Context, 50)
			for i := range below {
				// As the reverse proxy wraps it (a client trace), then the transport.
				var cancel context.CancelFunc
				below[i], cancel = context.WithCancel(context.WithValue(up, key("trace"), i))
				defer cancel()
			}
			Expect(runtime.NumGoroutine()).To(BeNumerically("<", before+10))
			leave()
			for _, b := range below {
				Eventually(b.Done()).Should(BeClosed())
			}
		})
	})

	It("ends a waiter's read when its own client leaves, without touching the leader or the others", func() {
		leader, _ := g.Join(ctx, k)
		wctx, leave := context.WithCancel(ctx)
		_, gone := g.Join(wctx, k)
		_, stays := g.Join(ctx, k)
		leader.Head(200, sseHeader)
		got := readAll(gone)
		leave()
		Eventually(got).Should(Receive(Equal(result{err: context.Canceled})))
		gone.Leave()
		gone.Leave() // twice is once
		Expect(leader.Waiters()).To(Equal(1))
		_, _ = leader.Write([]byte("x"))
		leader.Finish(true, usage.Usage{})
		Eventually(readAll(stays)).Should(Receive(Equal(result{body: "x"})))
		stays.Leave()
	})

	It("fans one answer out to many waiters at once", func() {
		g := cache.NewGroup(1 << 20)
		leader, _ := g.Join(ctx, k)
		const n = 50
		var wg sync.WaitGroup
		bodies := make([]string, n)
		for i := range n {
			_, w := g.Join(ctx, k)
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer w.Leave()
				if _, _, err := w.Head(); err != nil {
					return
				}
				var buf bytes.Buffer
				_, _ = io.Copy(&buf, w)
				bodies[i] = buf.String()
			}()
		}
		leader.Head(200, sseHeader)
		var want strings.Builder
		for i := range 200 {
			ev := fmt.Sprintf("data: %d\n\n", i)
			want.WriteString(ev)
			_, _ = leader.Write([]byte(ev))
		}
		leader.Finish(true, usage.Usage{})
		wg.Wait()
		for i := range n {
			Expect(bodies[i]).To(Equal(want.String()))
		}
	})
})
