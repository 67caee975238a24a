// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package report

import (
	"cmp"
	"encoding/json"
	"math"
	"slices"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
)

// RuleUsage is one rule window's use in a report: a window of rate_limiting.rules,
// in the rule's amount (tokens, input or output tokens, requests or US dollars).
type RuleUsage struct {
	// Rule is the rule's name.
	Rule string `json:"rule"`
	// Window is the window's index in the rule's windows.
	Window int `json:"win"`
	// Calendar is true for a calendar window: its counters hold what was spent since
	// the window started, and never refill before it ends.
	Calendar bool `json:"cal,omitempty"`
	// InUse is the number of the window's counters in use: one per subject (and
	// count_by value); a calendar window's counters of its current window only.
	InUse int `json:"n,omitempty"`
	// AtLimit is the number of counters that have used AtLimit or more of their
	// allowance.
	AtLimit int `json:"lim,omitempty"`
	// Top are the counters that use the largest part of their allowance, at most
	// TopSubjects; a window with one counter (a global rule, or a rule on one named
	// subject) reports it here.
	Top []RuleTop `json:"top,omitempty"`
	// Refused counts the refusals by the window over the report's window.
	Refused int64 `json:"r,omitempty"`
}

// RuleTop is one counter of a rule window: its subject, its count_by value and its
// use, drawn and not yet refilled (a calendar window: spent since its start), of its
// capacity (this replica's share under memory storage, the fleet total under Redis).
// Dollars keep their cents' fractions: the numbers are not rounded to whole units.
type RuleTop struct {
	ID       string  `json:"id,omitempty"`
	By       string  `json:"by,omitempty"`
	Used     float64 `json:"u"`
	Capacity float64 `json:"c"`
}

// ruleSlot is one rule window.
type ruleSlot struct {
	rule   string
	window uint8
}

// ruleScan is one rule window's scan.
type ruleScan struct {
	calendar bool
	inUse    int
	atLimit  int
	top      []RuleTop
	frac     []float64
}

// counterKey is one counter of a calendar window, whichever window start it holds.
type counterKey struct {
	ruleSlot
	id, by string
}

// calendarLevel is the newest calendar window's counter of a subject seen in a scan.
type calendarLevel struct {
	start           int64
	level, capacity float64
}

// addRule takes one rule counter. A calendar window's counters of windows that
// ended (a store keeps one until it expires or is swept) are left out: only the
// newest start of each subject counts.
func (a *accumulator) addRule(k budget.Key, level, capacity float64) {
	if k.Kind == budget.Calendar {
		ck := counterKey{ruleSlot{k.Rule, k.Window}, k.ID, k.By}
		if c, ok := a.calendars[ck]; ok && c.start >= k.Start {
			return
		}
		if a.calendars == nil {
			a.calendars = map[counterKey]calendarLevel{}
		}
		a.calendars[ck] = calendarLevel{k.Start, level, capacity}
		return
	}
	a.ruleCounter(ruleSlot{k.Rule, k.Window}, false, k.ID, k.By, level, capacity)
}

// ruleCounter counts one counter of a rule window.
func (a *accumulator) ruleCounter(sl ruleSlot, calendar bool, id, by string, level, capacity float64) {
	used := capacity - level
	// A rolling counter refills to exactly its capacity; a sliver left of a refill in
	// progress, or a calendar counter nothing was spent from, is no use.
	if !(used > capacity*1e-6) || !(used > 0) {
		return
	}
	if a.rules == nil {
		a.rules = map[ruleSlot]*ruleScan{}
	}
	s := a.rules[sl]
	if s == nil {
		s = &ruleScan{calendar: calendar}
		a.rules[sl] = s
	}
	s.inUse++
	frac := 1.0
	if capacity > 0 {
		frac = used / capacity
	}
	if frac >= AtLimit {
		s.atLimit++
	}
	i := 0
	for i < len(s.frac) && (s.frac[i] > frac || s.frac[i] == frac && (s.top[i].ID < id || s.top[i].ID == id && s.top[i].By < by)) {
		i++
	}
	if i >= TopSubjects {
		return
	}
	s.top = slices.Insert(s.top, i, RuleTop{ID: id, By: by, Used: rounded(used), Capacity: rounded(capacity)})
	s.frac = slices.Insert(s.frac, i, frac)
	if len(s.top) > TopSubjects {
		s.top, s.frac = s.top[:TopSubjects], s.frac[:TopSubjects]
	}
}

// finishRules writes the rule windows' scan and refusals into u, most used first,
// within the bytes the budgets left (size).
func (a *accumulator) finishRules(u *Usage, refused map[ruleSlot]int64, size int) {
	for ck, c := range a.calendars {
		a.ruleCounter(ck.ruleSlot, true, ck.id, ck.by, c.level, c.capacity)
	}
	out := make([]RuleUsage, 0, len(a.rules)+len(refused))
	for sl, s := range a.rules {
		out = append(out, RuleUsage{Rule: sl.rule, Window: int(sl.window), Calendar: s.calendar, InUse: s.inUse,
			AtLimit: s.atLimit, Top: s.top, Refused: refused[sl]})
		delete(refused, sl)
	}
	for sl, n := range refused {
		if n > 0 {
			out = append(out, RuleUsage{Rule: sl.rule, Window: int(sl.window), Refused: n})
		}
	}
	slices.SortFunc(out, func(x, y RuleUsage) int {
		if c := cmp.Compare(ruleWeight(y), ruleWeight(x)); c != 0 {
			return c
		}
		return cmp.Or(cmp.Compare(x.Rule, y.Rule), cmp.Compare(x.Window, y.Window))
	})
	for i := range out {
		b, _ := json.Marshal(out[i])
		if size += len(b) + 1; size > MaxUsageBytes {
			u.Cut += len(out) - i
			out = out[:i]
			break
		}
	}
	if len(out) > 0 {
		u.Rules = out
	}
}

// ruleWeight orders a report's rule windows: by the largest part of an allowance
// used, refusals counting as a full one, windows with many counters in use first
// among equals.
func ruleWeight(r RuleUsage) float64 {
	w := 0.0
	for _, t := range r.Top {
		if t.Capacity > 0 {
			w = max(w, t.Used/t.Capacity)
		} else {
			w = max(w, 1)
		}
	}
	if r.Refused > 0 {
		w = max(w, 1)
	}
	return w
}

// rounded keeps six decimals: dollars to the millionth, tokens and requests whole
// or nearly, and a report that does not change with the float's last bits.
func rounded(f float64) float64 {
	switch {
	case !(f > 0):
		return 0
	case !(f < math.MaxInt64/1e6):
		return math.MaxInt64 / 1e6
	}
	return math.Round(f*1e6) / 1e6
}
