// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package budget_test

import (
	"context"
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
		_, err := m.Reserve(context.Background(), &budget.Reservation{Tokens: []budget.Charge{full, drawn}, Amount: 600})
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
})
