// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package budget

import (
	"cmp"
	"slices"
	"time"
)

// DurableRule is one durable counter of the policy in force (a calendar window or a
// cost amount), described for a recovery that rebuilds its balances from an
// independent record of what was spent (the spend ledger).
type DurableRule struct {
	// Rule and Window name the counter as a Balance does.
	Rule, Window string
	// Tenant is the tenant whose rule it is; empty for the platform's.
	Tenant string
	// Dim is what the counter counts by; CountBy its fan-out (NumDimensions: none,
	// or an attribute beyond the dimensions, which Unrecorded names).
	Dim, CountBy Dimension
	// Unrecorded is an attribute beyond the dimensions that the counter counts by
	// or selects on (session, endpoint, ...): a record by dimension cannot rebuild
	// it. Empty: none.
	Unrecorded string
	Amount     Amount
	// Models, when set, are the only models it counts; Subjects the only subjects,
	// and Excluded the subjects a named-subject rule counts instead.
	Models, Subjects, Excluded []string
	// Start and End are the window that holds the present on the store's clock; a
	// rolling window's are its period back from the present.
	Start, End time.Time
}

// CachedWeight is what a cached input token counts in tokens and input_tokens.
func (p *Policy) CachedWeight() float64 { return p.cachedWeight }

// DurableRules are the durable counters of policy p in rule and window order, each
// with the window that holds the present.
func (l *Limiter) DurableRules(p *Policy) []DurableRule {
	now := l.clock.Now()
	if cs, ok := l.store.(CalendarStore); ok {
		now, _ = cs.CalendarNow()
	}
	var out []DurableRule
	for rw, c := range p.rules {
		if !c.durable {
			continue
		}
		d := c.describe(now)
		d.Rule = rw.rule
		out = append(out, d)
	}
	slices.SortFunc(out, func(a, b DurableRule) int {
		if c := p.order[a.Rule] - p.order[b.Rule]; c != 0 {
			return c
		}
		return cmp.Compare(a.Window, b.Window)
	})
	return out
}

// sorted is the set's names in order; nil for an empty set.
func (s set) sorted() []string {
	if len(s) == 0 {
		return nil
	}
	out := make([]string, 0, len(s))
	for n := range s {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// Counter describes the durable counter a charge draws on, with the window that
// holds now; false for a charge of no durable rule.
func (c *Charge) Counter(now time.Time) (DurableRule, bool) {
	if c.ctr == nil || !c.ctr.durable {
		return DurableRule{}, false
	}
	return c.ctr.describe(now), true
}

// describe is the durable counter c with the window that holds now.
func (c *counter) describe(now time.Time) DurableRule {
	d := DurableRule{Rule: c.rule, Window: c.name, Tenant: c.tenant, Dim: c.dim, CountBy: NumDimensions, Amount: c.amount,
		Models: c.models.sorted(), Subjects: c.subjects.sorted(), Excluded: c.excluded.sorted(),
		Start: now.Add(-c.period), End: now}
	if cd, ok := c.countBy.Dimension(); ok {
		d.CountBy = cd
	} else if c.countBy != NumAttrs {
		d.Unrecorded = c.countBy.String()
	}
	if len(c.when) > 0 {
		d.Unrecorded = c.when[0].attr.String()
	}
	if c.kind == Calendar {
		d.Start, d.End = c.calendar.Span(now)
	}
	return d
}
