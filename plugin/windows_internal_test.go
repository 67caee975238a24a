// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package plugin

import (
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	twv1alpha1 "github.com/tokenwarden/tokenwarden/api/v1alpha1"
)

// A calendar window comes back at its next start in its zone; a rolling one after the
// used part of its refill (its burst, when it has one), longer in debt.
func TestWindowBack(t *testing.T) {
	b := &twv1alpha1.TokenBudget{
		Spec: twv1alpha1.TokenBudgetSpec{Windows: []twv1alpha1.BudgetWindow{
			{Limit: resource.MustParse("600k"), Rolling: &twv1alpha1.RollingWindow{Period: twv1alpha1.PeriodMinute, BurstSeconds: 20}},
			{Limit: resource.MustParse("1000"), Calendar: &twv1alpha1.CalendarWindow{Every: "Month", TimeZone: "Europe/Berlin", DayOfMonth: 5, At: "06:00"}},
			{Limit: resource.MustParse("50"), Rolling: &twv1alpha1.RollingWindow{Period: twv1alpha1.PeriodHour}},
		}},
		Status: twv1alpha1.TokenBudgetStatus{Summary: twv1alpha1.BudgetSummary{Windows: "600k/min burst 20s, $1000/month from day 5 at 06:00 Europe/Berlin, 50/h"}},
	}
	ws := windowsOf(b)
	if len(ws) != 3 || ws[1].text != "$1000/month from day 5 at 06:00 Europe/Berlin" {
		t.Fatalf("windows %+v", ws)
	}
	now := time.Date(2026, 12, 1, 11, 0, 0, 0, time.UTC)
	if refill, _ := ws[0].back(50, now); refill != 10*time.Second {
		t.Errorf("a burst of 20s half used refills in %v, want 10s", refill)
	}
	if refill, _ := ws[2].back(150, now); refill != 90*time.Minute {
		t.Errorf("an hour window 150%% used (in debt) refills in %v, want 1h30m", refill)
	}
	_, resets := ws[1].back(80, now)
	want := time.Date(2026, 12, 5, 5, 0, 0, 0, time.UTC) // 06:00 in Berlin, winter time
	if !resets.Equal(want) {
		t.Errorf("the month window resets at %v, want %v", resets, want)
	}
	r := UsageRow{ResetsAt: &metav1.Time{Time: resets}}
	if got := fullIn(r, now); got != "3d18h (reset)" {
		t.Errorf("FULL IN of the month window is %q, want 3d18h (reset)", got)
	}
}

// A minute-and-day budget's top consumer is named on its more used period; the
// other period's figure names no subject.
func TestLimitRowsTopConsumer(t *testing.T) {
	b := &twv1alpha1.TokenBudget{
		ObjectMeta: metav1.ObjectMeta{Name: "per-key", Namespace: "llm"},
		Spec:       twv1alpha1.TokenBudgetSpec{ProxyRef: twv1alpha1.ProxyReference{Name: "fleet"}, Dimension: twv1alpha1.DimensionPerAPIKey, TokensPerMinute: 30000, TokensPerDay: 3000},
		Status: twv1alpha1.TokenBudgetStatus{
			Summary: twv1alpha1.BudgetSummary{Windows: "30k/min, 3k/day"},
			Usage: &twv1alpha1.TokenBudgetUsage{
				Minute: &twv1alpha1.PeriodUsage{UsedPercent: 10, UsedTokens: 3000}, Day: &twv1alpha1.PeriodUsage{UsedPercent: 100, UsedTokens: 3000},
				TopConsumer: "alice",
			},
		},
	}
	rows := usageRows(b, time.Now())
	if len(rows) != 2 || rows[0].Subject != "" || rows[1].Subject != "alice" || rows[1].Window != "3k/day" || rows[1].RefillSeconds != 86400 {
		t.Errorf("rows %+v", rows)
	}
}
