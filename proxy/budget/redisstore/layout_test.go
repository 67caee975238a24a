// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package redisstore_test

import (
	"context"
	"encoding/binary"
	"math"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/proxy/budget/storetest"
)

var _ = Describe("The stored key layout", func() {
	ctx := context.Background()
	m := budget.Charge{Key: budget.Key{Kind: budget.TokensMinute, Dim: budget.APIKey, ID: "bob"}, SharedCapacity: 600, SharedRate: 10}

	It("reads a key written before the expiry was stored: an upgrade keeps every budget", func() {
		s := newStore(storetest.NewClock(), nil, nil)
		DeferCleanup(s.Close)
		now, err := s.Client().Time(ctx).Result()
		Expect(err).NotTo(HaveOccurred())
		// The 96-byte layout: the minute bucket at 100 of 600, drawn just now; no
		// request-count or day bucket.
		v := make([]byte, 96)
		for i, x := range []float64{0, 0, -1, 0, 100, float64(now.UnixMicro()) / 1000, 600, 10, 0, 0, -1, 0} {
			binary.LittleEndian.PutUint64(v[8*i:], math.Float64bits(x))
		}
		Expect(s.Client().Set(ctx, s.Key(m.Key), v, time.Minute).Err()).To(Succeed())
		l, ok, err := s.Level(ctx, m.Key)
		Expect(err).NotTo(HaveOccurred())
		Expect(ok).To(BeTrue())
		Expect(l).To(BeNumerically("~", 100, 5))

		res, err := s.Reserve(ctx, &budget.Reservation{Tokens: budget.WithAmount([]budget.Charge{m}, 50)})
		Expect(err).NotTo(HaveOccurred())
		Expect(res.Admitted).To(BeTrue())
		Expect(res.TokenLevels[0]).To(BeNumerically("~", 50, 5), "the level the old layout held, not a full bucket")
		res, err = s.Reserve(ctx, &budget.Reservation{Tokens: budget.WithAmount([]budget.Charge{m}, 400)})
		Expect(err).NotTo(HaveOccurred())
		Expect(res.Admitted).To(BeFalse(), "the budget the old layout held is spent")
		Expect(s.Client().StrLen(ctx, s.Key(m.Key)).Val()).To(Equal(int64(104)), "rewritten in the layout with the expiry")
		Expect(s.Client().PTTL(ctx, s.Key(m.Key)).Val()).To(BeNumerically("~", 56*time.Second, time.Second),
			"550 tokens at 10 per second, plus a second")
	})

	It("keeps a rule's counter in the layout earlier versions read, so that none reads it as full", func() {
		s := newStore(storetest.NewClock(), nil, nil)
		DeferCleanup(s.Close)
		rule := budget.Charge{Key: budget.Key{Kind: budget.Rolling, Dim: budget.APIKey, ID: "bob", Rule: "in"}, SharedCapacity: 600, SharedRate: 10}
		Expect(s.Reserve(ctx, &budget.Reservation{Tokens: budget.WithAmount([]budget.Charge{m, rule}, 100)})).To(HaveField("Admitted", true))
		Expect(s.Client().StrLen(ctx, s.Key(rule.Key)).Val()).To(Equal(int64(96)))
		Expect(s.Client().PTTL(ctx, s.Key(rule.Key)).Val()).To(BeNumerically("~", 11*time.Second, time.Second))
		Expect(s.Client().StrLen(ctx, s.Key(m.Key)).Val()).To(Equal(int64(104)))
	})

	It("moves a key's expiry with what its buckets need, whether or not a write sets it again", func() {
		s := newStore(storetest.NewClock(), nil, nil)
		DeferCleanup(s.Close)
		ttl := func() time.Duration { return s.Client().PTTL(ctx, s.Key(m.Key)).Val() }
		Expect(s.Reserve(ctx, &budget.Reservation{Tokens: budget.WithAmount([]budget.Charge{m}, 300)})).To(HaveField("Admitted", true))
		Expect(ttl()).To(BeNumerically("~", 31*time.Second, time.Second), "300 tokens at 10 per second, plus a second")

		Expect(s.Reserve(ctx, &budget.Reservation{Tokens: budget.WithAmount([]budget.Charge{m}, 200)})).To(HaveField("Admitted", true))
		Expect(ttl()).To(BeNumerically("~", 51*time.Second, time.Second), "a take that needs longer lengthens it")

		s.Refund(ctx, budget.WithAmount([]budget.Charge{m}, 2))
		Expect(ttl()).To(BeNumerically("~", 51*time.Second, time.Second), "a small refund leaves it within the second")

		s.Refund(ctx, budget.WithAmount([]budget.Charge{m}, 400))
		Expect(ttl()).To(BeNumerically("~", 11*time.Second, time.Second), "a large refund shortens it")
		l, ok, err := s.Level(ctx, m.Key)
		Expect(err).NotTo(HaveOccurred())
		Expect(ok).To(BeTrue())
		Expect(l).To(BeNumerically("~", 502, 5))
	})
})
