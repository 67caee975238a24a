// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package budget

// Settlement is what settling a hold did beyond refunding and charging the usage:
// the part of an overage that no bucket could cover and went into debt.
type Settlement struct {
	// Debt is the most tokens any token bucket (tokens, input or output tokens) went
	// below zero for the request: a bucket already in debt counts the whole overage it
	// took, one that could cover part of it counts the rest. Under overage: forgive it
	// is 0, except on a calendar window's counter, which records every token.
	Debt float64
	// DebtDollars is the same for the US dollar buckets (cost amounts).
	DebtDollars float64
}

// SettleReceiver is told what a hold's settlement did (Hold.SettleTo).
type SettleReceiver interface {
	// Settled receives the settlement once the store has done it. It may run on a
	// goroutine of its own, and must not block.
	Settled(Settlement)
}

// add takes the debt each overage charge took on (parallel to charges).
func (s *Settlement) add(charges []Charge, debt []float64) {
	for i := range charges {
		if i >= len(debt) || !(debt[i] > 0) {
			continue
		}
		if c := charges[i].ctr; c != nil && c.amount == AmountCost {
			s.DebtDollars = max(s.DebtDollars, debt[i])
		} else {
			s.Debt = max(s.Debt, debt[i])
		}
	}
}
