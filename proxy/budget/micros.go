// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package budget

import "math"

// MicroDollars is an amount of US dollars in whole micro-dollars, rounded to the
// nearest (halves away from zero): the unit the proxy reports and records money in.
func MicroDollars(usd float64) int64 { return int64(math.Round(usd * 1e6)) }

// CostMicros is Cost in micro-dollars: what one settlement of usage costs at the
// model's price, rounded once; false for a model without a price.
func (p *Policy) CostMicros(model string, u Used) (int64, bool) {
	usd, ok := p.Cost(model, u)
	if !ok {
		return 0, false
	}
	return MicroDollars(usd), true
}
