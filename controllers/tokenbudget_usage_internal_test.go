// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package controllers

import (
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	twv1alpha1 "github.com/tokenwarden/tokenwarden/api/v1alpha1"
	"github.com/tokenwarden/tokenwarden/proxy/report"
)

// TestMeaningful is the refresh rule: which changes of a budget's usage are worth a
// status write.
func TestMeaningful(t *testing.T) {
	base := func() *twv1alpha1.TokenBudgetUsage {
		return &twv1alpha1.TokenBudgetUsage{
			Used:            "40%",
			Minute:          &twv1alpha1.PeriodUsage{UsedPercent: 40, UsedTokens: 400},
			SubjectsAtLimit: ptr.To(int32(2)),
			TopConsumer:     "alice",
			Refusals:        twv1alpha1.BudgetRefusals{IntervalSeconds: 60, Minute: 10},
		}
	}
	for _, c := range []struct {
		name   string
		change func(u *twv1alpha1.TokenBudgetUsage)
		want   bool
	}{
		{"nothing", func(*twv1alpha1.TokenBudgetUsage) {}, false},
		{"4 points", func(u *twv1alpha1.TokenBudgetUsage) { u.Minute.UsedPercent = 44; u.Minute.UsedTokens = 440 }, false},
		{"5 points", func(u *twv1alpha1.TokenBudgetUsage) { u.Minute.UsedPercent = 35; u.Minute.UsedTokens = 350 }, true},
		{"use ended", func(u *twv1alpha1.TokenBudgetUsage) { u.Minute.UsedPercent = 0; u.Minute.UsedTokens = 0 }, true},
		{"a period appeared", func(u *twv1alpha1.TokenBudgetUsage) { u.Day = &twv1alpha1.PeriodUsage{} }, true},
		{"one more at the limit", func(u *twv1alpha1.TokenBudgetUsage) { u.SubjectsAtLimit = ptr.To(int32(3)) }, true},
		{"another top consumer", func(u *twv1alpha1.TokenBudgetUsage) { u.TopConsumer = "bob" }, true},
		{"refusals up by half", func(u *twv1alpha1.TokenBudgetUsage) { u.Refusals.Minute = 15 }, false},
		{"refusals doubled", func(u *twv1alpha1.TokenBudgetUsage) { u.Refusals.Minute = 20 }, true},
		{"refusals halved", func(u *twv1alpha1.TokenBudgetUsage) { u.Refusals.Minute = 5 }, true},
		{"refusals stopped", func(u *twv1alpha1.TokenBudgetUsage) { u.Refusals.Minute = 0 }, true},
		{"day refusals started", func(u *twv1alpha1.TokenBudgetUsage) { u.Refusals.Day = 1 }, true},
		{"only the time", func(u *twv1alpha1.TokenBudgetUsage) { u.ObservedAt = metav1.NewTime(time.Now()) }, false},
	} {
		want := base()
		c.change(want)
		if got := meaningful(base(), want); got != c.want {
			t.Errorf("%s: meaningful = %v, want %v", c.name, got, c.want)
		}
	}
	if meaningful(nil, &twv1alpha1.TokenBudgetUsage{Minute: &twv1alpha1.PeriodUsage{}, SubjectsAtLimit: ptr.To(int32(0))}) {
		t.Error("an unused budget without usage is given one")
	}
	if !meaningful(nil, base()) || !meaningful(base(), nil) {
		t.Error("usage that appears or goes is not written")
	}
}

// TestSumUsage sums the reports of a memory fleet (shares added up) and of a Redis
// fleet (each report the whole: taken once), and hides the top consumer of another
// namespace's per-subject budget.
func TestSumUsage(t *testing.T) {
	now := time.Now()
	budget := func(ns string, dim twv1alpha1.Dimension, tpm, tpd int64, replicas int64) *twv1alpha1.TokenBudget {
		return &twv1alpha1.TokenBudget{
			ObjectMeta: metav1.ObjectMeta{Name: "b", Namespace: ns},
			Spec:       twv1alpha1.TokenBudgetSpec{ProxyRef: twv1alpha1.ProxyReference{Name: "fleet", Namespace: "llm"}, Dimension: dim, TokensPerMinute: tpm, TokensPerDay: tpd},
			Status:     twv1alpha1.TokenBudgetStatus{Replicas: replicas},
		}
	}
	replica := func(shared bool, bs ...report.BudgetUsage) indexedReport {
		return index(&report.Usage{Window: 60, Shared: shared, Budgets: bs})
	}
	// Memory, two replicas of a 10,000-token minute: 1,000 of 5,000 and 2,000 of 5,000.
	g := sumUsage(budget("llm", twv1alpha1.DimensionGlobal, 10000, 0, 2), []indexedReport{
		replica(false, report.BudgetUsage{Dimension: "global", Minute: &report.Level{Used: 1000, Capacity: 5000}, Refused: &report.Refused{Minute: 3}}),
		replica(false, report.BudgetUsage{Dimension: "global", Minute: &report.Level{Used: 2000, Capacity: 5000}, Refused: &report.Refused{Minute: 4}}),
	}, now)
	if g.Used != "30%" || g.Minute.UsedTokens != 3000 || g.Day != nil || g.Refusals.Minute != 7 || g.Refusals.IntervalSeconds != 60 || g.SubjectsAtLimit != nil {
		t.Errorf("memory global: %+v", g)
	}
	// Redis: both replicas read the same shared bucket.
	g = sumUsage(budget("llm", twv1alpha1.DimensionGlobal, 10000, 0, 1), []indexedReport{
		replica(true, report.BudgetUsage{Dimension: "global", Minute: &report.Level{Used: 3000, Capacity: 10000}}),
		replica(true, report.BudgetUsage{Dimension: "global", Minute: &report.Level{Used: 3010, Capacity: 10000}}),
	}, now)
	if g.Used != "30%" || g.Minute.UsedTokens != 3010 {
		t.Errorf("redis global: %+v", g)
	}
	// Memory, per key: alice draws on both replicas, bob on one; a key of another
	// namespace is named namespace/name.
	keys := []indexedReport{
		replica(false, report.BudgetUsage{Dimension: "api_key", AtLimit: 1, InUse: 2, Top: []report.Top{
			{ID: "team-a_alice", Period: "minute", Level: report.Level{Used: 480, Capacity: 500}},
			{ID: "bob", Period: "minute", Level: report.Level{Used: 300, Capacity: 500}}}}),
		replica(false, report.BudgetUsage{Dimension: "api_key", InUse: 1, Top: []report.Top{
			{ID: "team-a_alice", Period: "minute", Level: report.Level{Used: 400, Capacity: 500}}}}),
	}
	k := sumUsage(budget("llm", twv1alpha1.DimensionPerAPIKey, 1000, 0, 2), keys, now)
	if k.TopConsumer != "team-a/alice" || k.Used != "88%" || *k.SubjectsAtLimit != 1 || k.Minute.UsedTokens != 880 {
		t.Errorf("memory per key: %+v", k)
	}
	// The same figures on a tenant's PerAPIKey budget: counts only.
	k = sumUsage(budget("team-b", twv1alpha1.DimensionPerAPIKey, 1000, 0, 2), keys, now)
	if k.TopConsumer != "" || k.Used != "" || k.Minute != nil || *k.SubjectsAtLimit != 1 {
		t.Errorf("another namespace's per-key budget: %+v", k)
	}
	// A report the proxy did not write: a name longer than any subject is cut to
	// what the field holds, a negative use is none.
	long := strings.Repeat("x", 1000)
	k = sumUsage(budget("llm", twv1alpha1.DimensionPerUser, 1000, 1000, 1), []indexedReport{replica(true, report.BudgetUsage{Dimension: "user",
		Top: []report.Top{{ID: long, Period: "minute", Level: report.Level{Used: 500, Capacity: 1000}}, {ID: "x", Period: "day", Level: report.Level{Used: -5, Capacity: 1000}}}})}, now)
	if k.TopConsumer != long[:253] || k.Day.UsedPercent != 0 || k.Used != "50%" {
		t.Errorf("a forged report: %+v", k)
	}
	// A report that left budgets out marks the ones it did not hold.
	k = sumUsage(budget("llm", twv1alpha1.DimensionPerUser, 1000, 0, 2), []indexedReport{index(&report.Usage{Window: 60, Cut: 3})}, now)
	if !k.Partial {
		t.Errorf("a cut report: %+v", k)
	}
}

// BenchmarkSumUsage is the usage controller's work for one report change of a fleet
// with 2,000 PerModel budgets and three replicas, each reporting 1,000 of them.
func BenchmarkSumUsage(b *testing.B) {
	var budgets []*twv1alpha1.TokenBudget
	for i := range 2000 {
		budgets = append(budgets, &twv1alpha1.TokenBudget{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("m%d", i), Namespace: "llm"},
			Spec: twv1alpha1.TokenBudgetSpec{ProxyRef: twv1alpha1.ProxyReference{Name: "fleet"}, Dimension: twv1alpha1.DimensionPerModel,
				Model: fmt.Sprintf("model-%d", i), TokensPerMinute: 30000},
			Status: twv1alpha1.TokenBudgetStatus{Replicas: 3, Usage: &twv1alpha1.TokenBudgetUsage{Used: "40%",
				Minute: &twv1alpha1.PeriodUsage{UsedPercent: 40, UsedTokens: 12000}}},
		})
	}
	var reports []*report.Usage
	for r := range 3 {
		u := &report.Usage{Window: 60, Shared: false, Cut: 1000}
		for i := range 1000 {
			u.Budgets = append(u.Budgets, report.BudgetUsage{Dimension: "model", Model: fmt.Sprintf("model-%d", i+r),
				Minute: &report.Level{Used: 4000, Capacity: 10000}})
		}
		reports = append(reports, u)
	}
	now := time.Now()
	b.ResetTimer()
	writes := 0
	for range b.N {
		var idx []indexedReport
		for _, u := range reports {
			idx = append(idx, index(u))
		}
		writes = 0
		for _, tb := range budgets {
			if meaningful(tb.Status.Usage, sumUsage(tb, idx, now)) {
				writes++
			}
		}
	}
	b.ReportMetric(float64(writes), "writes")
}
