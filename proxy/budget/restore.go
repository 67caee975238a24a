// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package budget

import (
	"fmt"
	"time"
)

// Balance is one durable counter's spend in its current window, as a restore gives it
// (taken from the spend metrics or a billing export).
type Balance struct {
	// Rule is the rule's name.
	Rule string `json:"rule"`
	// Window names the rule's window as metrics and refusals do (calendar_month,
	// day, ...); it may be empty when the rule has one durable window.
	Window string `json:"window,omitempty"`
	// Subject is the identity the counter counts (the team, key, user, model or
	// client); empty for a global rule.
	Subject string `json:"subject,omitempty"`
	// By is the count_by value of a rule that fans out; empty otherwise.
	By string `json:"by,omitempty"`
	// Spent is what the window has spent so far, in the rule's amount (US dollars for
	// a cost rule).
	Spent float64 `json:"spent"`
}

// RestoreCharge resolves a balance to the counter it restores, in the window that
// holds the present on the store's clock: the charge's Key, SharedCapacity,
// SharedRate and EndMillis (0 for a rolling window) name the counter, and Amount is
// what was spent. Only durable rule windows (calendar windows, cost amounts) may be
// restored; an unknown rule or window is an error naming it.
func (l *Limiter) RestoreCharge(p *Policy, b Balance) (Charge, error) {
	var ctr *counter
	var windows []string
	for w := uint8(0); ; w++ {
		c := p.rules[ruleWindow{b.Rule, w}]
		if c == nil {
			break
		}
		if !c.durable {
			continue
		}
		windows = append(windows, c.name)
		if b.Window == c.name || (b.Window == "" && ctr == nil) {
			ctr = c
		}
	}
	switch {
	case len(windows) == 0:
		return Charge{}, fmt.Errorf("rule %q: no durable rule of this name is in force (a calendar window or a cost amount)", b.Rule)
	case ctr == nil:
		return Charge{}, fmt.Errorf("rule %q: window %q: not one of its durable windows %v", b.Rule, b.Window, windows)
	case b.Window == "" && len(windows) > 1:
		return Charge{}, fmt.Errorf("rule %q: window: required, the rule has several durable windows %v", b.Rule, windows)
	case b.Spent < 0:
		return Charge{}, fmt.Errorf("rule %q: spent: %v is below zero", b.Rule, b.Spent)
	case (ctr.dim == Global) != (b.Subject == ""):
		return Charge{}, fmt.Errorf("rule %q: subject: a %s rule's counter %s", b.Rule, ctr.dim,
			map[bool]string{true: "has no subject", false: "needs one"}[ctr.dim == Global])
	case (ctr.countBy != NumAttrs) != (b.By != ""):
		return Charge{}, fmt.Errorf("rule %q: by: the rule %s", b.Rule,
			map[bool]string{true: "counts by " + ctr.countBy.String() + ": name its value", false: "has no count_by"}[ctr.countBy != NumAttrs])
	}
	ch := Charge{
		Key:      Key{Kind: ctr.kind, Dim: ctr.dim, Window: ctr.window, ID: b.Subject, Tenant: ctr.tenant, Rule: ctr.rule, By: b.By},
		Capacity: ctr.capacity, Rate: ctr.rate, SharedCapacity: ctr.sharedCapacity, SharedRate: ctr.sharedRate,
		Amount: b.Spent, Period: ctr.period, Durable: true, ctr: ctr,
	}
	if ctr.kind == Calendar {
		now, shift := l.clock.Now(), time.Duration(0)
		if cs, ok := l.store.(CalendarStore); ok {
			now, shift = cs.CalendarNow()
		}
		start, end := ctr.calendar.Span(now)
		ch.Key.Start, ch.EndMillis = start.Unix(), end.Add(-shift).UnixMilli()
	}
	return ch, nil
}
