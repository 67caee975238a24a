// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package controllers

import (
	"math"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	twv1alpha1 "github.com/tokenwarden/tokenwarden/api/v1alpha1"
)

// clock is a test's time: it moves only when the test says.
type clock struct{ t time.Time }

func (c *clock) now() time.Time            { return c.t }
func (c *clock) advance(d time.Duration)   { c.t = c.t.Add(d) }
func (c *clock) at(start time.Time) *clock { c.t = start; return c }

// observe runs the forecast once a minute for d, the spend growing at perHour, and
// returns the last forecast.
func observe(t *testing.T, c *clock, f *twv1alpha1.BudgetForecast, spent *float64, perHour float64, d time.Duration, start, end time.Time) *twv1alpha1.BudgetForecast {
	t.Helper()
	for range int(d / time.Minute) {
		c.advance(time.Minute)
		*spent += perHour / 60
		f = forecastOf(f, "$1000/month", twv1alpha1.AmountCost, spendNow{now: c.now(), start: start, end: end, spent: *spent, limit: 1000})
	}
	return f
}

// The alert's first promtool case (charts/tokenwarden/rules/alerts_test.yaml): a
// $1,000 month half spent at a net $3.60 an hour, evaluated at Unix time 6000 with
// the reset at 864000, projects 135.8% of the limit; a tenth of the pace, 58.6%. The
// status makes the same projection from the same figures.
func TestForecastAgreesWithTheAlert(t *testing.T) {
	for _, tc := range []struct {
		perHour    float64
		projected  float64
		runsOut    bool
		wantStatus metav1.ConditionStatus
	}{
		{3.6, 1358, true, metav1.ConditionTrue},
		{0.36, 585.8, false, metav1.ConditionFalse},
	} {
		start, end := time.Unix(0, 0), time.Unix(864000, 0)
		c := (&clock{}).at(time.Unix(6000-100*60, 0))
		spent := 500 - tc.perHour*100/60
		f := observe(t, c, nil, &spent, tc.perHour, 100*time.Minute, start, end)
		p := project(f.Samples, spendNow{now: c.now(), start: start, end: end, spent: spent, limit: 1000})
		if !p.ok || math.Abs(p.projected-tc.projected) > 1e-3 || math.Abs(p.rate*3600-tc.perHour) > 1e-6 {
			t.Fatalf("at $%v/h: projected $%v at $%v/h, want $%v", tc.perHour, p.projected, p.rate*3600, tc.projected)
		}
		if p.lookback < forecastLookback || p.lookback > forecastLookback+forecastSampleEvery {
			t.Errorf("lookback %v, want the last hour", p.lookback)
		}
		if got := forecastCondition(f, 1); got.Status != tc.wantStatus {
			t.Errorf("at $%v/h: %s %s (%s), want %s", tc.perHour, got.Type, got.Status, got.Message, tc.wantStatus)
		}
		if (f.RunsOutAt != nil && f.RunsOutAt.Before(&f.ResetsAt)) != tc.runsOut {
			t.Errorf("at $%v/h: runs out at %v, resets at %v", tc.perHour, f.RunsOutAt, f.ResetsAt)
		}
	}
}

// A steady $10 an hour from $100 of a $1000 day window that resets in 24 hours:
// $340 by the reset, never out; the figures in status read so.
func TestForecastSteady(t *testing.T) {
	start := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	end := start.Add(24 * time.Hour)
	c := (&clock{}).at(start)
	spent := 100.0
	f := observe(t, c, nil, &spent, 10, 2*time.Hour, start, end)
	if f.BurnRate != "$10.00/h" || f.Spent != "$120.00" || f.Projected != "$340.00 (34%)" || f.RunsOutAt == nil ||
		!f.RunsOutAt.Equal(&metav1.Time{Time: c.now().Add(88 * time.Hour)}) {
		t.Fatalf("forecast %+v", f)
	}
	if f.LookbackSeconds < 3600 || f.LookbackSeconds > 3900 {
		t.Errorf("lookback %ds, want an hour", f.LookbackSeconds)
	}
	if got := forecastCondition(f, 1); got.Status != metav1.ConditionFalse || got.Reason != twv1alpha1.ReasonWithinLimit {
		t.Errorf("condition %+v", got)
	}
	if len(f.Samples) > 14 {
		t.Errorf("%d samples kept, want those of the last hour and one before", len(f.Samples))
	}
}

// A window spent at $5 an hour that jumps to $60 an hour: the projection follows the
// pace within the lookback and turns the condition True.
func TestForecastAccelerating(t *testing.T) {
	start := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	end := start.Add(24 * time.Hour)
	c := (&clock{}).at(start)
	spent := 0.0
	f := observe(t, c, nil, &spent, 5, 2*time.Hour, start, end)
	if got := forecastCondition(f, 1); got.Status != metav1.ConditionFalse {
		t.Fatalf("at $5/h: %+v", got)
	}
	slow := *f.ProjectedPercent
	f = observe(t, c, f, &spent, 60, 30*time.Minute, start, end)
	if *f.ProjectedPercent <= slow {
		t.Errorf("projected %d%% after the pace rose, was %d%%", *f.ProjectedPercent, slow)
	}
	f = observe(t, c, f, &spent, 60, time.Hour, start, end)
	got := forecastCondition(f, 1)
	if got.Status != metav1.ConditionTrue || f.BurnRate != "$60.00/h" {
		t.Fatalf("after an hour at $60/h: %s at %s: %+v", f.Projected, f.BurnRate, got)
	}
	// $100 spent at $60/h: $900 left, 15 hours.
	if want := c.now().Add(15 * time.Hour); !f.RunsOutAt.Time.Equal(want) {
		t.Errorf("runs out at %v, want %v", f.RunsOutAt, want)
	}
}

// A window that spends nothing for an hour: no burn rate, the spend stays the
// projection, never out.
func TestForecastIdle(t *testing.T) {
	start := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	end := start.Add(24 * time.Hour)
	c := (&clock{}).at(start)
	spent := 900.0
	f := observe(t, c, nil, &spent, 0, 90*time.Minute, start, end)
	if f.BurnRate != "$0.00/h" || f.Projected != "$900.00 (90%)" || f.RunsOutAt != nil {
		t.Fatalf("forecast %+v", f)
	}
	if got := forecastCondition(f, 1); got.Status != metav1.ConditionFalse {
		t.Errorf("condition %+v", got)
	}
}

// The alert's reset case (charts/tokenwarden/rules/alerts_test.yaml): a $1,000 day
// spent at $60 an hour resets at Unix time 3600; forty minutes later $40 of the new
// day is spent and its reset is at 90000. The alert's counters keep the pace across
// the reset, 0.04 + $60/h x 23.3 h: 144% of the limit; the status's samples, of the
// old window and of the new, make the same projection, never a fall.
func TestForecastWindowJustReset(t *testing.T) {
	reset, next := time.Unix(3600, 0), time.Unix(90000, 0)
	c := (&clock{}).at(time.Unix(0, 0))
	var f *twv1alpha1.BudgetForecast
	var s spendNow
	for m := 1; m <= 100; m++ {
		c.advance(time.Minute)
		s = spendNow{now: c.now(), start: reset.Add(-24 * time.Hour), end: reset, spent: 440 + float64(m), limit: 1000}
		if !c.now().Before(reset) {
			s.start, s.end, s.spent = reset, next, float64(m-60)
		}
		f = forecastOf(f, "$1000/day", twv1alpha1.AmountCost, s)
	}
	p := project(f.Samples, s)
	if !p.ok || math.Abs(p.rate*3600-60) > 1e-6 || math.Abs(p.projected/1000-1.44) > 1e-6 {
		t.Fatalf("across the reset: $%v/h, projected $%v, want $60/h and $1440", p.rate*3600, p.projected)
	}
	if f.Spent != "$40.00" || !f.ResetsAt.Time.Equal(next) || f.Projected != "$1440.00 (144%)" {
		t.Errorf("forecast %+v", f)
	}
	if got := forecastCondition(f, 1); got.Status != metav1.ConditionTrue {
		t.Errorf("condition %+v", got)
	}
}

// Under five minutes of samples the forecast shows the spend only, and the condition
// is Unknown.
func TestForecastCollectingSamples(t *testing.T) {
	start := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	c := (&clock{}).at(start)
	spent := 100.0
	f := observe(t, c, nil, &spent, 600, 4*time.Minute, start, start.Add(time.Hour))
	if f.Projected != "" || f.RunsOutAt != nil || f.Spent != "$140.00" {
		t.Fatalf("forecast %+v", f)
	}
	if got := forecastCondition(f, 1); got.Status != metav1.ConditionUnknown {
		t.Errorf("condition %+v", got)
	}
}

// Samples stay bounded over a long run, and a clock that goes back drops the samples
// from its future.
func TestForecastSamplesBounded(t *testing.T) {
	start := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	c := (&clock{}).at(start)
	spent := 0.0
	f := observe(t, c, nil, &spent, 1, 48*time.Hour, start, start.Add(72*time.Hour))
	if n := len(f.Samples); n > forecastMaxSamples || n < 12 {
		t.Fatalf("%d samples", n)
	}
	if old := c.now().Sub(f.Samples[0].At.Time); old < forecastLookback || old > forecastLookback+forecastSampleEvery {
		t.Errorf("oldest sample %v old", old)
	}
	c.advance(-2 * time.Hour)
	s := keepSamples(f.Samples, spendNow{now: c.now(), start: start, end: start.Add(72 * time.Hour), spent: spent, limit: 1000})
	for _, p := range s {
		if p.At.After(c.now()) {
			t.Fatalf("sample at %v kept at %v", p.At, c.now())
		}
	}
}
