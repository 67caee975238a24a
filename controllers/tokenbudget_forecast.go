// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package controllers

import (
	"fmt"
	"math"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	twv1alpha1 "github.com/tokenwarden/tokenwarden/api/v1alpha1"
	"github.com/tokenwarden/tokenwarden/controllers/render"
	"github.com/tokenwarden/tokenwarden/proxy/config"
)

// The forecast's lookback: the burn rate is the spend's net increase over the last
// hour, as the TokenwardenCalendarBudgetRunningOut alert's rate(...[1h]) measures it.
const (
	forecastLookback    = time.Hour
	forecastSampleEvery = 5 * time.Minute
	// forecastMinLookback is the shortest lookback a projection is made from.
	forecastMinLookback = forecastSampleEvery
	forecastMaxSamples  = 16
)

// spendNow is a calendar window's spend observed now.
type spendNow struct {
	now        time.Time
	start, end time.Time // the window's span
	spent      float64
	limit      float64
}

// projection is a forecast's figures: the burn rate (per second) over the lookback,
// the spend at the window's end and when it reaches the limit.
type projection struct {
	ok        bool // the lookback is long enough
	lookback  time.Duration
	rate      float64
	projected float64
	runsOut   time.Time // zero: never at this rate
}

// keepSamples returns the samples the burn rate is measured from after now: those of
// the last hour and the newest one older, with now's spend appended when the newest
// sample is forecastSampleEvery old, at most forecastMaxSamples. Samples from the
// future (a clock that went back) are dropped.
func keepSamples(prev []twv1alpha1.SpendSample, s spendNow) []twv1alpha1.SpendSample {
	out := make([]twv1alpha1.SpendSample, 0, len(prev)+1)
	for _, p := range prev {
		if !p.At.After(s.now) {
			out = append(out, p)
		}
	}
	if n := len(out); n == 0 || !out[n-1].At.Add(forecastSampleEvery).After(s.now) {
		out = append(out, twv1alpha1.SpendSample{At: metav1.NewTime(s.now), WindowStart: metav1.NewTime(s.start),
			SpentMicros: micros(s.spent)})
	}
	base := 0
	for i, p := range out {
		if !p.At.After(s.now.Add(-forecastLookback)) {
			base = i
		}
	}
	out = out[base:]
	if len(out) > forecastMaxSamples {
		out = out[len(out)-forecastMaxSamples:]
	}
	return out
}

// project measures the burn rate from the samples to now's spend and projects it to
// the window's end. The increase sums each step's growth; a step to less spend counts
// the later spend whole, as rate() counts a counter's reset. A step into a later
// window counts the new window's spend whole too, and the time from the old window's
// last sample to its end, whose spend no sample saw, is left out of the lookback: at
// a steady pace the rate is the one a counter across the reset shows.
func project(samples []twv1alpha1.SpendSample, s spendNow) projection {
	if len(samples) == 0 {
		return projection{}
	}
	base := samples[0]
	var increase float64
	var unseen time.Duration
	prev := base
	step := func(at time.Time, start time.Time, spent int64) {
		switch {
		case !start.Equal(prev.WindowStart.Time):
			increase += float64(spent)
			if start.After(prev.At.Time) && !start.After(at) {
				unseen += start.Sub(prev.At.Time)
			}
		case spent >= prev.SpentMicros:
			increase += float64(spent - prev.SpentMicros)
		default:
			increase += float64(spent)
		}
		prev = twv1alpha1.SpendSample{At: metav1.NewTime(at), WindowStart: metav1.NewTime(start), SpentMicros: spent}
	}
	for _, p := range samples[1:] {
		step(p.At.Time, p.WindowStart.Time, p.SpentMicros)
	}
	if !prev.At.Time.Equal(s.now) {
		step(s.now, s.start, micros(s.spent))
	}
	lookback := s.now.Sub(base.At.Time) - unseen
	if lookback < forecastMinLookback {
		return projection{lookback: lookback}
	}
	rate := increase / 1e6 / lookback.Seconds()
	p := projection{ok: true, lookback: lookback, rate: rate, projected: s.spent + rate*s.end.Sub(s.now).Seconds()}
	switch {
	case s.spent >= s.limit:
		p.runsOut = s.now
	case rate > 0:
		// Capped within time.Duration's range: a century is "not this window".
		secs := min((s.limit-s.spent)/rate, 100*365*24*3600)
		p.runsOut = s.now.Add(time.Duration(secs * float64(time.Second)))
	}
	return p
}

// micros is an amount in millionths, within int64.
func micros(v float64) int64 {
	return int64(min(max(math.Round(v*1e6), 0), math.MaxInt64/2))
}

// forecastOf is the budget's forecast after s, from the samples its status holds.
func forecastOf(prev *twv1alpha1.BudgetForecast, window string, amount twv1alpha1.Amount, s spendNow) *twv1alpha1.BudgetForecast {
	var samples []twv1alpha1.SpendSample
	if prev != nil && prev.Window == window {
		samples = prev.Samples
	}
	samples = keepSamples(samples, s)
	p := project(samples, s)
	f := &twv1alpha1.BudgetForecast{Window: window, Spent: amountText(amount, s.spent),
		SpentPercent: percent(s.spent, s.limit), ResetsAt: metav1.NewTime(s.end), Samples: samples}
	if !p.ok {
		return f
	}
	f.LookbackSeconds = int64(p.lookback.Seconds())
	f.BurnRate = amountText(amount, p.rate*3600) + "/h"
	pct := percent(p.projected, s.limit)
	f.ProjectedPercent = &pct
	f.Projected = fmt.Sprintf("%s (%d%%)", amountText(amount, p.projected), pct)
	if !p.runsOut.IsZero() {
		f.RunsOutAt = ptr.To(metav1.NewTime(p.runsOut.Round(time.Second)))
	}
	return f
}

// percent is v's part of limit, in percent, within int32.
func percent(v, limit float64) int32 {
	if limit <= 0 {
		return 0
	}
	return int32(min(max(math.Round(100*v/limit), 0), math.MaxInt32))
}

// firstCalendar is a budget's first calendar window: its rule's name, its index and
// the window; ok is false for a budget without one.
func firstCalendar(b *twv1alpha1.TokenBudget) (key ruleWindow, w config.Window, amount twv1alpha1.Amount, ok bool) {
	for _, g := range render.Groups(b) {
		for i, w := range g.Windows {
			if w.Calendar != nil {
				return ruleWindow{b.Namespace + "/" + b.Name + g.Suffix, i}, w, g.Amount, true
			}
		}
	}
	return ruleWindow{}, config.Window{}, "", false
}

// calendarSpend is the spend of a calendar window in the reports: of its one counter,
// or of the most spent one. Shared reports hold the fleet's spend (the largest is
// taken); a replica's memory holds its own, and they are added up.
func calendarSpend(reports []indexedReport, key ruleWindow) float64 {
	used := map[counterOf][2]float64{}
	for _, rep := range reports {
		e := rep.rules[key]
		if e == nil {
			continue
		}
		for _, t := range e.Top {
			c := counterOf{t.ID, t.By}
			v := used[c]
			if rep.Shared {
				v[1] = max(v[1], t.Used)
			} else {
				v[0] += t.Used
			}
			used[c] = v
		}
	}
	top := 0.0
	for _, v := range used {
		top = max(top, v[0]+v[1])
	}
	return top
}

// budgetForecast is the forecast of a budget's first calendar window from the
// reports, or nil: a budget without a calendar window, a budget of another namespace
// with a counter per subject (it shows no subject's level), or a window never spent
// from.
func budgetForecast(tp *twv1alpha1.TokenProxy, b *twv1alpha1.TokenBudget, reports []indexedReport, now time.Time) *twv1alpha1.BudgetForecast {
	if !render.RendersAsRules(tp, b) {
		return nil
	}
	key, w, amount, ok := firstCalendar(b)
	if !ok || !oneCounter(b) && render.Foreign(b) {
		return nil
	}
	spent := calendarSpend(reports, key)
	if spent <= 0 && b.Status.Forecast == nil {
		return nil
	}
	start, end := w.Calendar.Span(now)
	return forecastOf(b.Status.Forecast, render.WindowText(amount, w, w.Limit), amount,
		spendNow{now: now, start: start, end: end, spent: spent, limit: w.Limit})
}

// forecastCondition is the ProjectedToRunOut condition a forecast makes.
func forecastCondition(f *twv1alpha1.BudgetForecast, generation int64) metav1.Condition {
	c := metav1.Condition{Type: twv1alpha1.ConditionProjectedToRunOut, ObservedGeneration: generation}
	switch {
	case f.ProjectedPercent == nil:
		c.Status, c.Reason = metav1.ConditionUnknown, twv1alpha1.ReasonCollectingSamples
		c.Message = fmt.Sprintf("%s of %s spent; the burn rate needs %s of samples", f.Spent, f.Window, forecastMinLookback)
	case f.RunsOutAt != nil && !f.RunsOutAt.After(f.ResetsAt.Time):
		c.Status, c.Reason = metav1.ConditionTrue, twv1alpha1.ReasonProjectedToRunOut
		c.Message = fmt.Sprintf("%s of %s spent at %s over the last %s: %s by the reset at %s, runs out at %s",
			f.Spent, f.Window, f.BurnRate, time.Duration(f.LookbackSeconds)*time.Second, f.Projected,
			f.ResetsAt.UTC().Format(time.RFC3339), f.RunsOutAt.UTC().Format(time.RFC3339))
	default:
		c.Status, c.Reason = metav1.ConditionFalse, twv1alpha1.ReasonWithinLimit
		c.Message = fmt.Sprintf("%s of %s spent at %s over the last %s: %s by the reset at %s",
			f.Spent, f.Window, f.BurnRate, time.Duration(f.LookbackSeconds)*time.Second, f.Projected,
			f.ResetsAt.UTC().Format(time.RFC3339))
	}
	return c
}

// forecastMoved reports whether want differs enough from have to be written: it
// appeared or went, a sample was taken, the projection appeared, moved by usagePoints
// or more, or its run-out time appeared or went, or the spend moved by usagePoints.
func forecastMoved(have, want *twv1alpha1.BudgetForecast) bool {
	if (have == nil) != (want == nil) {
		return true
	}
	if have == nil {
		return false
	}
	if len(have.Samples) != len(want.Samples) || len(want.Samples) > 0 && !have.Samples[len(have.Samples)-1].At.Equal(&want.Samples[len(want.Samples)-1].At) {
		return true
	}
	hp, wp := have.ProjectedPercent, want.ProjectedPercent
	return have.Window != want.Window || abs(have.SpentPercent-want.SpentPercent) >= usagePoints ||
		(hp == nil) != (wp == nil) || hp != nil && abs(*hp-*wp) >= usagePoints ||
		(have.RunsOutAt == nil) != (want.RunsOutAt == nil) || !have.ResetsAt.Equal(&want.ResetsAt)
}

// conditionChanged reports whether the budget's condition of c's type differs in
// status or reason from c.
func conditionChanged(conds []metav1.Condition, c metav1.Condition) bool {
	have := meta.FindStatusCondition(conds, c.Type)
	return have == nil || have.Status != c.Status || have.Reason != c.Reason
}
