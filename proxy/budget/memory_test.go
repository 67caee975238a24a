// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package budget_test

import (
	"context"
	"fmt"
	"time"

	"testing"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/proxy/budget/storetest"
)

func TestBudget(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "Budget Suite")
}

var _ = storetest.DescribeStore("memory", storetest.Factory{
	New: func(clock budget.Clock, maxBuckets int64) budget.Store { return budget.NewMemory(clock, maxBuckets) },
	Level: func(s budget.Store, k budget.Key) (float64, bool) {
		return s.(*budget.Memory).Level(k)
	},
	Bounded: true,
	Prunes:  true,
})

var _ = Describe("memory sweep", func() {
	It("drops only the buckets that refilled, which changes no decision", func() {
		clock := storetest.NewClock()
		m := budget.NewMemory(clock, 100)
		full := budget.Charge{Key: budget.Key{Kind: budget.TokensMinute, Dim: budget.Client, ID: "a"}, Capacity: 600, Rate: 10}
		drawn := budget.Charge{Key: budget.Key{Kind: budget.TokensDay, Dim: budget.Client, ID: "a"}, Capacity: 86400, Rate: 1}
		_, err := m.Reserve(context.Background(), &budget.Reservation{Tokens: budget.WithAmount([]budget.Charge{full, drawn}, 600)})
		Expect(err).NotTo(HaveOccurred())
		clock.Advance(61 * time.Second)
		m.Sweep()
		_, ok := m.Level(full.Key)
		Expect(ok).To(BeFalse())
		l, ok := m.Level(drawn.Key)
		Expect(ok).To(BeTrue())
		Expect(l).To(BeNumerically("~", 86400-600+61, 0.01))
		Expect(m.Len(budget.TokensMinute)).To(BeZero())
	})

	It("never drops a bucket in debt, which would forgive it", func() {
		clock := storetest.NewClock()
		m := budget.NewMemory(clock, 100)
		owed := budget.Charge{Key: budget.Key{Kind: budget.TokensMinute, Dim: budget.APIKey, ID: "k"}, Capacity: 600, Rate: 10}
		res, err := m.Reserve(context.Background(), &budget.Reservation{Tokens: budget.WithAmount([]budget.Charge{owed}, 600)})
		Expect(err).NotTo(HaveOccurred())
		Expect(res.Admitted).To(BeTrue())
		m.Charge(context.Background(), budget.WithAmount([]budget.Charge{owed}, 600), budget.Debt)
		m.Sweep()
		l, ok := m.Level(owed.Key)
		Expect(ok).To(BeTrue())
		Expect(l).To(BeNumerically("~", -600, 1e-9))
		clock.Advance(61 * time.Second) // debt repaid, 10 tokens refilled
		m.Sweep()
		l, ok = m.Level(owed.Key)
		Expect(ok).To(BeTrue())
		Expect(l).To(BeNumerically("~", 10, 1e-9))
		clock.Advance(60 * time.Second)
		m.Sweep()
		_, ok = m.Level(owed.Key)
		Expect(ok).To(BeFalse(), "whole again: an absent bucket is a full one")
	})
})

var _ = Describe("memory bucket maps", func() {
	It("bound each dimension and kind on its own, and count them apart", func() {
		m := budget.NewMemory(storetest.NewClock(), 3)
		ctx := context.Background()
		for i := range 10 {
			c := budget.Charge{Key: budget.Key{Kind: budget.TokensMinute, Dim: budget.Client, ID: fmt.Sprint("2001:db8::", i)}, Capacity: 600, Rate: 10}
			_, err := m.Reserve(ctx, &budget.Reservation{Tokens: budget.WithAmount([]budget.Charge{c}, 1)})
			Expect(err).NotTo(HaveOccurred())
		}
		for _, d := range []budget.Dimension{budget.APIKey, budget.User, budget.Team, budget.Model, budget.Global} {
			for _, k := range []budget.Kind{budget.Requests, budget.TokensMinute, budget.TokensDay} {
				c := budget.Charge{Key: budget.Key{Kind: k, Dim: d, ID: "x"}, Capacity: 600, Rate: 10}
				res, err := m.Reserve(ctx, &budget.Reservation{Tokens: budget.WithAmount([]budget.Charge{c}, 1)})
				Expect(err).NotTo(HaveOccurred())
				Expect(res.TokenSkipped).To(Equal([]bool{false}), "%v/%v has a map of its own", d, k)
			}
		}
		Expect(m.LenOf(budget.Client, budget.TokensMinute)).To(Equal(int64(3)))
		Expect(m.LenOf(budget.APIKey, budget.TokensMinute)).To(Equal(int64(1)))
		Expect(m.Len(budget.TokensMinute)).To(Equal(int64(3 + 5)))
	})
})
