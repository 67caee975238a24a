// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package budget_test

import (
	"context"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/proxy/budget/storetest"
)

// levels collects a scan by key.
func levels(l budget.Leveler) map[budget.Key][2]float64 {
	GinkgoHelper()
	out := map[budget.Key][2]float64{}
	Expect(l.EachLevel(context.Background(), func(k budget.Key, level, capacity float64) {
		Expect(out).NotTo(HaveKey(k), "each bucket once")
		out[k] = [2]float64{level, capacity}
	})).To(Succeed())
	return out
}

var _ = Describe("memory usage scan", func() {
	It("reports every token bucket at its level now, never a request bucket, and changes nothing", func() {
		clock := storetest.NewClock()
		m := budget.NewMemory(clock, 100)
		minute := func(dim budget.Dimension, id string, c float64) budget.Charge {
			return budget.Charge{Key: budget.Key{Kind: budget.TokensMinute, Dim: dim, ID: id}, Capacity: c, Rate: c / 60}
		}
		day := budget.Charge{Key: budget.Key{Kind: budget.TokensDay, Dim: budget.Global}, Capacity: 86400, Rate: 1}
		reqs := budget.Charge{Key: budget.Key{Kind: budget.Requests, Dim: budget.APIKey, ID: "alice"}, Capacity: 5, Rate: 5, Amount: 1}
		for _, r := range []*budget.Reservation{
			{Requests: []budget.Charge{reqs}, Tokens: budget.WithAmount([]budget.Charge{minute(budget.APIKey, "alice", 600), day}, 500)},
			{Tokens: budget.WithAmount([]budget.Charge{minute(budget.APIKey, "bob", 600)}, 60)},
			{Tokens: budget.WithAmount([]budget.Charge{minute(budget.Model, "claude", 6000)}, 1000)},
		} {
			res, err := m.Reserve(context.Background(), r)
			Expect(err).NotTo(HaveOccurred())
			Expect(res.Admitted).To(BeTrue())
		}
		clock.Advance(6 * time.Second) // the minute buckets refill a tenth, the day one 6 tokens

		got := levels(m)
		Expect(got).To(Equal(map[budget.Key][2]float64{
			{Kind: budget.TokensMinute, Dim: budget.APIKey, ID: "alice"}: {160, 600},
			{Kind: budget.TokensMinute, Dim: budget.APIKey, ID: "bob"}:   {600, 600},
			{Kind: budget.TokensMinute, Dim: budget.Model, ID: "claude"}: {5600, 6000},
			day.Key: {86400 - 500 + 6, 86400},
		}))
		// The scan refilled nothing and dropped nothing: the levels are where the next
		// request finds them.
		Expect(levels(m)).To(Equal(got))
		Expect(m.Len(budget.Requests)).To(Equal(int64(1)))
	})

	It("stops when its context ends", func() {
		m := budget.NewMemory(storetest.NewClock(), 100)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		Expect(m.EachLevel(ctx, func(budget.Key, float64, float64) {})).To(MatchError(context.Canceled))
	})
})
