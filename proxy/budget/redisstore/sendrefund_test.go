// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package redisstore_test

import (
	"context"
	"fmt"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/proxy/budget/redisstore"
	"github.com/tokenwarden/tokenwarden/test/redisserver"
)

// A settlement that only refunds does not wait for Redis (budget.RefundSender): the
// refund rides with a later pipeline. What a stopping proxy relies on is that the
// wait group it gave stays pending until the refund is applied, and is always done in
// the end, whatever becomes of Redis.
var _ = Describe("A refund sent without waiting", func() {
	ctx := context.Background()
	open := func(url string, linger time.Duration) *redisstore.Store {
		s, err := redisstore.New(redisstore.Options{URL: url, Prefix: fmt.Sprintf("t%d", prefixes.Add(1)),
			DialTimeout: 100 * time.Millisecond, ReadTimeout: 100 * time.Millisecond, WriteTimeout: 100 * time.Millisecond,
			RefundLinger: linger})
		Expect(err).NotTo(HaveOccurred())
		return s
	}
	// waited closes once wg is done.
	waited := func(wg *sync.WaitGroup) chan struct{} {
		done := make(chan struct{})
		go func() { wg.Wait(); close(done) }()
		return done
	}

	It("is pending on its wait group until Redis has applied it", func() {
		s := open(srv.URL(), 300*time.Millisecond)
		DeferCleanup(s.Close)
		r := everyDimensionOf(500, "sent", 1e6)
		res, err := s.Reserve(ctx, r)
		Expect(err).NotTo(HaveOccurred())
		Expect(res.Admitted).To(BeTrue())
		day := r.Tokens[1].Key // global, per day: it refills 11.6 tokens a second
		Expect(day.Kind).To(Equal(budget.TokensDay))
		level := func() float64 {
			l, ok, err := s.Level(ctx, day)
			Expect(err).NotTo(HaveOccurred())
			Expect(ok).To(BeTrue())
			return l
		}
		before := level()

		var wg sync.WaitGroup
		s.SendRefund(budget.WithAmount(r.Tokens, 300), &wg)
		done := waited(&wg)
		// It gathers for the linger: not applied, and pending.
		Consistently(done, 100*time.Millisecond).ShouldNot(BeClosed())
		Expect(level()).To(BeNumerically("~", before, 10))
		Eventually(done).Should(BeClosed())
		Expect(level()).To(BeNumerically("~", before+300, 10), "applied once its wait group is done")
	})

	It("is given up, and its wait group done, when the store closes with Redis not answering", func() {
		own := redisserver.Start(GinkgoT())
		s := open(own.URL(), time.Millisecond)
		r := everyDimensionOf(500, "paused", 1e6)
		_, err := s.Reserve(ctx, r)
		Expect(err).NotTo(HaveOccurred())
		Expect(own.Pause()).To(Succeed())
		DeferCleanup(own.Resume)
		var wg sync.WaitGroup
		for range 20 {
			s.SendRefund(budget.WithAmount(r.Tokens, 10), &wg)
		}
		done := waited(&wg)
		Expect(s.Close()).To(Succeed())
		Eventually(done).Should(BeClosed())

		// And one sent after Close is given up at once.
		var late sync.WaitGroup
		s.SendRefund(budget.WithAmount(r.Tokens, 10), &late)
		Eventually(waited(&late)).Should(BeClosed())
	})
})
