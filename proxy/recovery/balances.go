// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package recovery

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/proxy/ledger"
)

// ledgerDims are the budget dimensions the ledger records, by its column.
var ledgerDims = map[budget.Dimension]ledger.Dimension{
	budget.APIKey: ledger.APIKey, budget.User: ledger.User, budget.Team: ledger.Team,
	budget.Model: ledger.Model, budget.Tenant: ledger.Tenant,
}

// answerable tells whether the ledger records what rule r counts by: every dimension
// but the client address.
func answerable(r budget.DurableRule) bool {
	if r.Unrecorded != "" {
		return false
	}
	if _, ok := ledgerDims[r.Dim]; !ok && r.Dim != budget.Global {
		return false
	}
	_, ok := ledgerDims[r.CountBy]
	return ok || r.CountBy == budget.NumDimensions
}

// dimOf names what makes a rule unanswerable.
func dimOf(r budget.DurableRule) string {
	if r.Unrecorded != "" {
		return r.Unrecorded
	}
	if _, ok := ledgerDims[r.Dim]; !ok && r.Dim != budget.Global {
		return r.Dim.String()
	}
	return r.CountBy.String()
}

// Balances sums each durable rule's current window from the ledger into the balances
// an attestation restores: one per subject (and count_by value) that spent in it, in
// the rule's amount. Each rule's sum is one query of the fleet's rollups, bounded by
// SumTimeout. A minute's rollup counts whole: a rolling window is summed from the
// start of the minute that holds its start, never less than it spent.
func Balances(ctx context.Context, report Report, fleet string, rules []budget.DurableRule, cachedWeight float64) ([]budget.Balance, error) {
	var out []budget.Balance
	for _, r := range rules {
		bs, err := ruleBalances(ctx, report, fleet, r, cachedWeight)
		if err != nil {
			return nil, fmt.Errorf("rule %q, window %s: %w", r.Rule, r.Window, err)
		}
		out = append(out, bs...)
	}
	return out, nil
}

func ruleBalances(ctx context.Context, report Report, fleet string, r budget.DurableRule, cachedWeight float64) ([]budget.Balance, error) {
	q := ledger.Query{From: r.Start.Truncate(time.Minute), To: r.End, Where: map[ledger.Dimension]string{ledger.Fleet: fleet}}
	if r.Tenant != "" {
		q.Where[ledger.Tenant] = r.Tenant
	}
	subject, by := ledgerDims[r.Dim], ledgerDims[r.CountBy]
	for _, d := range []ledger.Dimension{subject, by} {
		if d != "" && !slices.Contains(q.GroupBy, d) {
			q.GroupBy = append(q.GroupBy, d)
		}
	}
	if len(r.Models) > 0 && !slices.Contains(q.GroupBy, ledger.Model) {
		q.GroupBy = append(q.GroupBy, ledger.Model)
	}
	if !q.From.Before(q.To) {
		return nil, nil
	}
	sctx, cancel := context.WithTimeout(ctx, SumTimeout)
	defer cancel()
	rows, err := report(sctx, q)
	if err != nil {
		return nil, err
	}
	type counter struct{ subject, by string }
	spent := map[counter]float64{}
	var order []counter
	for _, row := range rows {
		c := counter{row.Group[subject], row.Group[by]}
		switch {
		case subject != "" && c.subject == "", by != "" && c.by == "":
			continue // traffic without the identity: the rule did not count it
		case len(r.Models) > 0 && !slices.Contains(r.Models, row.Group[ledger.Model]):
			continue
		case len(r.Subjects) > 0 && !slices.Contains(r.Subjects, c.subject):
			continue
		case slices.Contains(r.Excluded, c.subject):
			continue
		}
		if _, seen := spent[c]; !seen {
			order = append(order, c)
		}
		spent[c] += amountOf(r.Amount, &row.Sums, cachedWeight)
	}
	var out []budget.Balance
	for _, c := range order {
		if v := spent[c]; v > 0 {
			out = append(out, budget.Balance{Rule: r.Rule, Window: r.Window, Subject: c.subject, By: c.by, Spent: v})
		}
	}
	return out, nil
}

// amountOf is what a rollup's settlements count in a rule's amount, as settlement
// charges them: a cached input token counts cachedWeight of one, an answer from the
// response cache is no request.
func amountOf(a budget.Amount, s *ledger.Sums, cachedWeight float64) float64 {
	input := float64(s.InputTokens) + (cachedWeight-1)*float64(min(s.CachedTokens, s.InputTokens))
	switch a {
	case budget.AmountCost:
		return float64(s.CostMicros) / 1e6
	case budget.AmountTokens:
		return input + float64(s.OutputTokens)
	case budget.AmountInput:
		return input
	case budget.AmountOutput:
		return float64(s.OutputTokens)
	case budget.AmountRequests:
		return float64(s.Requests - s.CacheHits)
	}
	return 0
}
