// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package budget_test

import (
	"context"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/proxy/budget/storetest"
)

// told is a SettleReceiver that passes each settlement on.
type told chan budget.Settlement

func (t told) Settled(s budget.Settlement) { t <- s }

var _ = Describe("A settlement", func() {
	ctx := context.Background()

	DescribeTable("tells the most tokens a bucket went into debt for",
		func(overage string, async bool, debt float64) {
			p := policy(`  overage: ` + overage + `
  limits:
    global: {tokens_per_minute: 60000}
    per_api_key: {tokens_per_minute: 600, tokens_per_day: 1000}
`)
			clock := storetest.NewClock()
			l := budget.NewLimiter(budget.NewMemory(clock, 100), budget.NopRecorder{}, clock, async)
			dec, err := l.Admit(ctx, p, budget.Identity{Key: p.Key("alice")}, budget.Ask{Input: 500})
			Expect(err).NotTo(HaveOccurred())
			// 500 reserved, 1,400 used: global holds the 900 more; the key's minute bucket
			// (100 left) goes to -600, its bound, and its day bucket (500 left) to -400.
			to := make(told, 1)
			Expect(dec.Hold.SettleTo(budget.Used{Input: 1400}, to)).To(BeTrue())
			Eventually(to).Should(Receive(Equal(budget.Settlement{Debt: debt})))
			Expect(dec.Hold.SettleTo(budget.Used{Input: 1400}, to)).To(BeFalse(), "a hold settles once")
			Consistently(to).ShouldNot(Receive())
		},
		Entry("under debt", "debt", false, 600.0),
		Entry("under debt, settled off the request's goroutine", "debt", true, 600.0),
		Entry("under forgive", "forgive", false, 0.0),
	)

})
