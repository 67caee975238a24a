// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package recovery_test

import (
	"context"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/proxy/ledger"
	"github.com/tokenwarden/tokenwarden/proxy/recovery"
)

var _ = Describe("the balances summed from the ledger", func() {
	It("sum each rule's window by its dimension, count_by, models, subjects and amount", func() {
		ctx := context.Background()
		sink, err := ledger.Open(ctx, "sqlite::memory:")
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(sink.Close)
		start := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
		row := func(at time.Time, fleet, tenant, key, team, model string, s ledger.Sums) ledger.Row {
			return ledger.Row{Minute: at.Unix(), Dims: ledger.Dims{Fleet: fleet, Tenant: tenant, APIKey: key, User: key, Team: team, Model: model}, Sums: s}
		}
		rows := []ledger.Row{
			row(start.Add(time.Hour), "f", "", "alice", "search", "gpt-4o", ledger.Sums{Requests: 3, InputTokens: 300, OutputTokens: 30, CachedTokens: 100, CostMicros: 1_500_000, CacheHits: 1}),
			row(start.Add(2*time.Hour), "f", "", "bob", "ads", "gpt-4o-mini", ledger.Sums{Requests: 2, InputTokens: 200, OutputTokens: 20, CostMicros: 250_000}),
			row(start.Add(2*time.Hour), "f", "t1", "t1_carol", "ads", "gpt-4o", ledger.Sums{Requests: 1, InputTokens: 100, OutputTokens: 10, CostMicros: 700_000}),
			row(start.Add(3*time.Hour), "f", "", "", "", "gpt-4o", ledger.Sums{Requests: 1, InputTokens: 10, CostMicros: 10_000}),            // anonymous
			row(start.Add(-time.Minute), "f", "", "alice", "search", "gpt-4o", ledger.Sums{Requests: 1, CostMicros: 9_000_000}),              // the window before
			row(start.Add(time.Hour), "other", "", "alice", "search", "gpt-4o", ledger.Sums{Requests: 1, CostMicros: 9_000_000}),             // another fleet
			row(start.Add(10*time.Hour+30*time.Second), "f", "", "alice", "search", "gpt-4o", ledger.Sums{Requests: 1, CostMicros: 100_000}), // the rolling hour's first minute
		}
		_, err = sink.Apply(ctx, &ledger.Batch{Replica: "r", Seq: 1, Rows: rows})
		Expect(err).NotTo(HaveOccurred())
		month := func(r budget.DurableRule) budget.DurableRule {
			r.Window, r.Start, r.End, r.CountBy = "calendar_month", start, start.AddDate(0, 1, 0), budget.NumDimensions
			return r
		}
		rules := []budget.DurableRule{
			month(budget.DurableRule{Rule: "fleet", Dim: budget.Global, Amount: budget.AmountCost}),
			month(budget.DurableRule{Rule: "keys", Dim: budget.APIKey, Amount: budget.AmountCost}),
			month(budget.DurableRule{Rule: "teams-4o", Dim: budget.Team, Amount: budget.AmountCost, Models: []string{"gpt-4o"}}),
			month(budget.DurableRule{Rule: "named", Dim: budget.APIKey, Amount: budget.AmountTokens, Subjects: []string{"alice"}}),
			month(budget.DurableRule{Rule: "others", Dim: budget.User, Amount: budget.AmountRequests, Excluded: []string{"alice"}}),
			month(budget.DurableRule{Rule: "tenant", Tenant: "t1", Dim: budget.Global, Amount: budget.AmountCost}),
			func() budget.DurableRule {
				r := month(budget.DurableRule{Rule: "by-model", Dim: budget.Team, Amount: budget.AmountInput})
				r.CountBy = budget.Model
				return r
			}(),
			{Rule: "hourly", Window: "hour", Dim: budget.Global, CountBy: budget.NumDimensions, Amount: budget.AmountCost,
				Start: start.Add(10*time.Hour + 40*time.Second), End: start.Add(11*time.Hour + 40*time.Second)},
		}
		bs, err := recovery.Balances(ctx, sink.Report, "f", rules, 0.5)
		Expect(err).NotTo(HaveOccurred())
		got := map[string]float64{}
		for _, b := range bs {
			got[b.Rule+"/"+b.Subject+"/"+b.By] = b.Spent
		}
		Expect(got).To(Equal(map[string]float64{
			"fleet//":     2.56, // every row of the fleet in the month, the anonymous one too
			"keys/alice/": 1.6, "keys/bob/": 0.25, "keys/t1_carol/": 0.7,
			"teams-4o/search/": 1.6, "teams-4o/ads/": 0.7, // bob's gpt-4o-mini is not counted
			"named/alice/": 300 - 50 + 30, // a cached token counts half
			"others/bob/":  2, "others/t1_carol/": 1,
			"tenant//":               0.7,
			"by-model/search/gpt-4o": 250, "by-model/ads/gpt-4o-mini": 200, "by-model/ads/gpt-4o": 100,
			"hourly//": 0.1, // from the start of the minute that holds the window's start
		}))
	})
})
