// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package report

import (
	"cmp"
	"context"
	"encoding/json"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
)

// UsageAnnotation on a replica's Lease is the replica's usage report: the JSON of a
// Usage. The operator sums the fleet's reports into each TokenBudget's status.usage.
const UsageAnnotation = "tokenwarden.io/usage"

// Bounds of a usage report.
const (
	// MaxUsageBytes bounds the annotation, well inside the 256 KiB that all of a
	// Lease's annotations may hold: a fleet with thousands of PerModel budgets reports
	// its most used ones, and says how many it left out.
	MaxUsageBytes = 64 << 10
	// TopSubjects is how many subjects of a per-subject dimension a report names for
	// each period: the ones that use the largest part of their allowance.
	TopSubjects = 3
	// AtLimit is the part of its allowance a subject must have used to count as at its
	// limit: less than 5% of the period's allowance is left.
	AtLimit = 0.95
	// RefusalScans is how many scans a report's refusal counts cover: four, so that the
	// operator, which writes a budget's usage at most once per scan interval, sees every
	// refusal in some write, and a report of a replica that stopped refusing changes
	// four scans later and then no more.
	RefusalScans = 4
)

// Usage is one replica's usage report. It holds no time, so that an idle fleet's
// report does not change from one scan to the next and the Lease is not rewritten for
// it; the Lease's renewTime tells when it was last confirmed.
type Usage struct {
	// Window is the seconds the refusal counts cover: RefusalScans scan intervals, as
	// configured (a measured time would change the report of an idle replica).
	Window int64 `json:"w"`
	// Shared is true when the levels were read from the fleet's shared (Redis) buckets:
	// every replica then reports the whole fleet's use, and the operator takes one
	// report rather than summing them. False: this replica's own buckets, its share.
	Shared bool `json:"s,omitempty"`
	// Budgets are the dimensions (and models) with any use or refusal; an idle one is
	// left out.
	Budgets []BudgetUsage `json:"b,omitempty"`
	// Rules are the windows of rate_limiting.rules with any use or refusal; an idle
	// one is left out.
	Rules []RuleUsage `json:"rl,omitempty"`
	// Cut is the number of budgets and rule windows left out to keep the report under
	// MaxUsageBytes: the least used ones.
	Cut int `json:"cut,omitempty"`
}

// BudgetUsage is one dimension's (or one model's) use in a report.
type BudgetUsage struct {
	// Dimension is the budget package's name of the dimension (global, client,
	// api_key, user, team, model).
	Dimension string `json:"dim"`
	// Model is the model of a model budget.
	Model string `json:"model,omitempty"`
	// Minute and Day are the one bucket's use, for a dimension with one bucket (global,
	// model).
	Minute *Level `json:"m,omitempty"`
	Day    *Level `json:"d,omitempty"`
	// AtLimit is, for a per-subject dimension, the number of subjects that have used
	// AtLimit or more of their allowance of either period.
	AtLimit int `json:"lim,omitempty"`
	// InUse is the number of the dimension's buckets in use (a subject in use on both
	// periods counts twice): a scan counts them without remembering every subject.
	InUse int `json:"n,omitempty"`
	// Top are the subjects that use the largest part of their allowance, at most
	// TopSubjects per period.
	Top []Top `json:"top,omitempty"`
	// Refused counts the refusals by the dimension's buckets over the report's window.
	Refused *Refused `json:"r,omitempty"`
}

// Level is a bucket's use: the tokens drawn and not yet refilled, of its capacity
// (this replica's share under memory storage, the fleet total under Redis). Used may
// exceed the capacity by up to one capacity: a debt.
type Level struct {
	Used     int64 `json:"u"`
	Capacity int64 `json:"c"`
}

// Top is one subject's use of one period.
type Top struct {
	// ID is the subject: the ApiKey (as the config names it), user, team or client
	// address.
	ID string `json:"id"`
	// Period is "minute" or "day".
	Period string `json:"p"`
	Level
}

// Refused counts refusals by period: a minute or day token budget, or the request
// rate.
type Refused struct {
	Minute   int64 `json:"m,omitempty"`
	Day      int64 `json:"d,omitempty"`
	Requests int64 `json:"q,omitempty"`
}

func (r *Refused) empty() bool { return r == nil || r.Minute+r.Day+r.Requests == 0 }

// Refusals counts the replica's refusals by dimension, model and period, and by rule
// window, until the next report takes them. It is called only for a refused request,
// never on an admitted one.
type Refusals struct {
	mu    sync.Mutex
	n     map[slot]*Refused
	rules map[ruleSlot]int64
}

// RefusedRule counts one refusal by a rule's window (its index in the rule's windows).
func (r *Refusals) RefusedRule(rule string, window uint8) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.rules == nil {
		r.rules = map[ruleSlot]int64{}
	}
	r.rules[ruleSlot{rule, window}]++
}

// slot is a budget of the config: a dimension, and the model of a model budget.
type slot struct {
	dim   budget.Dimension
	model string
}

// Refused counts one refusal by dimension d's bucket of kind k (Requests, TokensMinute
// or TokensDay); model is the request's model, kept only for the model dimension.
func (r *Refusals) Refused(d budget.Dimension, k budget.Kind, model string) {
	if d != budget.Model {
		model = ""
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.n == nil {
		r.n = map[slot]*Refused{}
	}
	c := r.n[slot{d, model}]
	if c == nil {
		c = &Refused{}
		r.n[slot{d, model}] = c
	}
	switch k {
	case budget.Requests:
		c.Requests++
	case budget.TokensMinute:
		c.Minute++
	case budget.TokensDay:
		c.Day++
	}
}

// take returns the counts and starts again from zero.
func (r *Refusals) take() refusalScan {
	if r == nil {
		return refusalScan{}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	n := refusalScan{r.n, r.rules}
	r.n, r.rules = nil, nil
	return n
}

// refusalScan is the refusals one scan took.
type refusalScan struct {
	limits map[slot]*Refused
	rules  map[ruleSlot]int64
}

// Summarizer builds a replica's usage reports. Summary is called from one goroutine
// (the Lease's).
type Summarizer struct {
	// Levels are the buckets the report reads: the shared store when storage is Redis
	// (Shared set), the replica's memory otherwise.
	Levels budget.Leveler
	Shared bool
	// Fallback, with a shared Levels, is read when the shared store cannot be: the
	// replica's own buckets, reported as its share.
	Fallback budget.Leveler
	// Refusals are the replica's refusal counts; nil reports none.
	Refusals *Refusals
	// Every is how often Summary is called.
	Every time.Duration

	// scans are the refusal counts of the last RefusalScans scans, newest last.
	scans []refusalScan
}

// perSubject reports whether a dimension has one bucket per subject.
func perSubject(d budget.Dimension) bool {
	return d == budget.Client || d == budget.APIKey || d == budget.User || d == budget.Team
}

// Summary scans the buckets and returns the report, with the refusals counted over the
// last RefusalScans scans. A scan that fails on the shared store falls back to
// Fallback.
func (s *Summarizer) Summary(ctx context.Context) (*Usage, error) {
	u := &Usage{Shared: s.Shared, Window: int64(math.Ceil((RefusalScans * s.Every).Seconds()))}
	acc := newAccumulator()
	err := s.Levels.EachLevel(ctx, acc.add)
	if err != nil && s.Shared && s.Fallback != nil && ctx.Err() == nil {
		acc = newAccumulator()
		u.Shared = false
		err = s.Fallback.EachLevel(ctx, acc.add)
	}
	if err != nil {
		return nil, err
	}
	s.scans = append(s.scans, s.Refusals.take())
	if len(s.scans) > RefusalScans {
		s.scans = s.scans[len(s.scans)-RefusalScans:]
	}
	refused, ruleRefused := map[slot]*Refused{}, map[ruleSlot]int64{}
	for _, scan := range s.scans {
		for sl, n := range scan.rules {
			ruleRefused[sl] += n
		}
		for sl, r := range scan.limits {
			sum := refused[sl]
			if sum == nil {
				sum = &Refused{}
				refused[sl] = sum
			}
			sum.Minute += r.Minute
			sum.Day += r.Day
			sum.Requests += r.Requests
		}
	}
	size := acc.finish(u, refused)
	acc.finishRules(u, ruleRefused, size)
	return u, nil
}

// accumulator sums one scan.
type accumulator struct {
	shared map[slot]*BudgetUsage
	subj   [budget.NumDimensions]*subjects
	// rules are the rule windows' scans; calendars the newest calendar counter of
	// each subject, counted into rules when the scan is done.
	rules     map[ruleSlot]*ruleScan
	calendars map[counterKey]calendarLevel
}

// subjects is one per-subject dimension's scan.
type subjects struct {
	inUse   int
	atLimit map[string]bool
	top     [budget.NumKinds][]Top
	frac    [budget.NumKinds][]float64
}

func newAccumulator() *accumulator { return &accumulator{shared: map[slot]*BudgetUsage{}} }

// add takes one bucket.
func (a *accumulator) add(k budget.Key, level, capacity float64) {
	if k.Rule != "" {
		a.addRule(k, level, capacity)
		return
	}
	if k.Kind != budget.TokensMinute && k.Kind != budget.TokensDay {
		return
	}
	used := capacity - level
	if !(used >= 1) && capacity > 0 {
		return // a full bucket (or nearly): no use to report
	}
	lv := Level{Used: saturated(used), Capacity: saturated(capacity)}
	if !perSubject(k.Dim) {
		sl := slot{k.Dim, ""}
		if k.Dim == budget.Model {
			sl.model = k.ID
		}
		b := a.shared[sl]
		if b == nil {
			b = &BudgetUsage{Dimension: k.Dim.String(), Model: sl.model}
			a.shared[sl] = b
		}
		if k.Kind == budget.TokensDay {
			b.Day = &lv
		} else {
			b.Minute = &lv
		}
		return
	}
	s := a.subj[k.Dim]
	if s == nil {
		s = &subjects{atLimit: map[string]bool{}}
		a.subj[k.Dim] = s
	}
	s.inUse++
	frac := 1.0
	if capacity > 0 {
		frac = used / capacity
	}
	if frac >= AtLimit {
		s.atLimit[k.ID] = true
	}
	// Keep the TopSubjects largest fractions of the period, largest first, ties by
	// name: the same buckets make the same report, whatever the map order.
	tops, fracs := s.top[k.Kind], s.frac[k.Kind]
	i := 0
	for i < len(fracs) && (fracs[i] > frac || fracs[i] == frac && tops[i].ID < k.ID) {
		i++
	}
	if i >= TopSubjects {
		return
	}
	tops = slices.Insert(tops, i, Top{ID: k.ID, Period: k.Kind.String(), Level: lv})
	fracs = slices.Insert(fracs, i, frac)
	if len(tops) > TopSubjects {
		tops, fracs = tops[:TopSubjects], fracs[:TopSubjects]
	}
	s.top[k.Kind], s.frac[k.Kind] = tops, fracs
}

// finish writes the scan and the refusals into u, most used first, within
// MaxUsageBytes, and returns the report's size so far.
func (a *accumulator) finish(u *Usage, refused map[slot]*Refused) int {
	var out []BudgetUsage
	for d, s := range a.subj {
		if s == nil {
			continue
		}
		b := BudgetUsage{Dimension: budget.Dimension(d).String(), AtLimit: len(s.atLimit), InUse: s.inUse}
		b.Top = append(b.Top, s.top[budget.TokensMinute]...)
		b.Top = append(b.Top, s.top[budget.TokensDay]...)
		if r := refused[slot{budget.Dimension(d), ""}]; !r.empty() {
			b.Refused = r
		}
		delete(refused, slot{budget.Dimension(d), ""})
		out = append(out, b)
	}
	for sl, b := range a.shared {
		if r := refused[sl]; !r.empty() {
			b.Refused = r
		}
		delete(refused, sl)
		out = append(out, *b)
	}
	for sl, r := range refused {
		if !r.empty() {
			out = append(out, BudgetUsage{Dimension: sl.dim.String(), Model: sl.model, Refused: r})
		}
	}
	// Most used first (per-subject dimensions, with their at-limit counts, before
	// any single bucket), so that a cut leaves out the least used.
	slices.SortFunc(out, func(x, y BudgetUsage) int {
		if c := cmp.Compare(weight(y), weight(x)); c != 0 {
			return c
		}
		if c := cmp.Compare(x.Dimension, y.Dimension); c != 0 {
			return c
		}
		return cmp.Compare(x.Model, y.Model)
	})
	size := 64 // the envelope
	for i := range out {
		b, _ := json.Marshal(out[i])
		if size += len(b) + 1; size > MaxUsageBytes {
			u.Cut = len(out) - i
			u.Budgets = out[:i]
			return MaxUsageBytes
		}
	}
	u.Budgets = out
	return size
}

// weight orders a report's budgets: per-subject dimensions first, then by the largest
// part of an allowance used, refusals counting as a full one.
func weight(b BudgetUsage) float64 {
	if b.InUse > 0 {
		return 10
	}
	w := 0.0
	for _, l := range []*Level{b.Minute, b.Day} {
		if l != nil && l.Capacity > 0 {
			w = max(w, float64(l.Used)/float64(l.Capacity))
		}
	}
	if !b.Refused.empty() {
		w = max(w, 1)
	}
	return w
}

// saturated converts a token count to int64, rounding, saturating at 0 and
// math.MaxInt64.
func saturated(f float64) int64 {
	switch {
	case !(f > 0):
		return 0
	case !(f < math.MaxInt64):
		return math.MaxInt64
	}
	return int64(math.Round(f))
}

// Encode is the annotation value of a report.
func (u *Usage) Encode() string {
	b, _ := json.Marshal(u)
	return string(b)
}
