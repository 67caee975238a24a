// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package controllers

import (
	"math"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	twv1alpha1 "github.com/tokenwarden/tokenwarden/api/v1alpha1"
	"github.com/tokenwarden/tokenwarden/proxy/report"
)

// TestSumRuleUsage sums rule windows' reports: a team rule's one counter over a
// memory fleet (shares added up), a per-key request rule's top consumer and subjects
// at their limit, a Redis fleet's calendar spend in dollars (taken once), and the
// refusals by window; another namespace's budget hides its top consumer.
func TestSumRuleUsage(t *testing.T) {
	now := time.Now()
	budget := func(ns, name string, spec twv1alpha1.TokenBudgetSpec) *twv1alpha1.TokenBudget {
		spec.ProxyRef = twv1alpha1.ProxyReference{Name: "fleet", Namespace: "llm"}
		return &twv1alpha1.TokenBudget{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Spec: spec}
	}
	// The fleet, in namespace llm: Flat, where a budget of another namespace governs
	// every tenant's subjects, and Namespaces, where it governs its own tenant's.
	flat := &twv1alpha1.TokenProxy{ObjectMeta: metav1.ObjectMeta{Name: "fleet", Namespace: "llm"}, Spec: twv1alpha1.TokenProxySpec{Tenancy: twv1alpha1.TenancyFlat}}
	tree := flat.DeepCopy()
	tree.Spec.Tenancy = twv1alpha1.TenancyNamespaces
	replica := func(shared bool, rs ...report.RuleUsage) indexedReport {
		return index(&report.Usage{Window: 60, Shared: shared, Rules: rs})
	}

	// A PerTeam rule naming one team, 10,000 tokens a minute and 100 requests a
	// second: two replicas' shares of the minute, 3,000 and 2,000 of 5,000 each.
	team := budget("llm", "ml", twv1alpha1.TokenBudgetSpec{Dimension: twv1alpha1.DimensionPerTeam, Subjects: []string{"ml"},
		TokensPerMinute: 10000, RequestsPerSecond: 100})
	u := sumRuleUsage(flat, team, []indexedReport{
		replica(false, report.RuleUsage{Rule: "llm/ml", Window: 0, InUse: 1, Top: []report.RuleTop{{ID: "ml", Used: 3000, Capacity: 5000}}, Refused: 2}),
		replica(false, report.RuleUsage{Rule: "llm/ml", Window: 0, InUse: 1, Top: []report.RuleTop{{ID: "ml", Used: 2000, Capacity: 5000}}},
			report.RuleUsage{Rule: "llm/ml/requests", Window: 0, Refused: 1}),
	}, now)
	if u.Used != "50%" || len(u.Windows) != 2 || u.SubjectsAtLimit != nil || u.TopConsumer != "" {
		t.Fatalf("team rule: %+v", u)
	}
	if w := u.Windows[0]; w.Window != "10k/min" || ptr.Deref(w.UsedPercent, -1) != 50 || w.Used != "5k" || w.Refused != 2 || w.SubjectsAtLimit != nil {
		t.Fatalf("team rule's minute: %+v", w)
	}
	if w := u.Windows[1]; w.Window != "100 req/s" || ptr.Deref(w.UsedPercent, -1) != 0 || w.Used != "" || w.Refused != 1 {
		t.Fatalf("team rule's request rate: %+v", w)
	}
	if u.Refusals.IntervalSeconds != 60 || idle(u) {
		t.Fatalf("refusals: %+v", u)
	}

	// A per-key request rule (amount Requests, 5 a second), each key its own counter.
	keys := budget("llm", "keys", twv1alpha1.TokenBudgetSpec{Dimension: twv1alpha1.DimensionPerAPIKey, Amount: twv1alpha1.AmountRequests,
		Windows: []twv1alpha1.BudgetWindow{{Limit: resource.MustParse("5"), Rolling: &twv1alpha1.RollingWindow{Period: twv1alpha1.PeriodSecond}}}})
	reps := []indexedReport{
		replica(false, report.RuleUsage{Rule: "llm/keys", InUse: 2, AtLimit: 1,
			Top: []report.RuleTop{{ID: "bob", Used: 2, Capacity: 2}, {ID: "team-b_carol", Used: 1, Capacity: 2}}}),
		replica(false, report.RuleUsage{Rule: "llm/keys", InUse: 1, Top: []report.RuleTop{{ID: "team-b_carol", Used: 2, Capacity: 2}}}),
	}
	u = sumRuleUsage(flat, keys, reps, now)
	if u.Used != "60%" || u.TopConsumer != "team-b/carol" || ptr.Deref(u.SubjectsAtLimit, -1) != 1 {
		t.Fatalf("per-key rule: %+v", u)
	}
	if w := u.Windows[0]; w.Window != "5 req/s" || w.Used != "3 req" || w.TopConsumer != "team-b/carol" {
		t.Fatalf("per-key rule's window: %+v", w)
	}
	foreignKeys := keys.DeepCopy()
	foreignKeys.Namespace = "team-b"
	foreignKeys.Name = "keys"
	for i := range reps {
		reps[i].Rules[0].Rule = "team-b/keys"
		reps[i] = index(reps[i].Usage)
	}
	if u := sumRuleUsage(flat, foreignKeys, reps, now); u.TopConsumer != "" || u.Used != "" || ptr.Deref(u.SubjectsAtLimit, -1) != 1 ||
		u.Windows[0] != (twv1alpha1.WindowUsage{Window: "5 req/s", SubjectsAtLimit: u.Windows[0].SubjectsAtLimit}) || idle(u) {
		t.Fatalf("another namespace's budget shows no subject nor its level, only the count at the limit: %+v", u)
	}
	// Under Namespaces the same budget is team-b's own: its counters are of team-b's
	// keys only, and team-b sees which and how much.
	if u := sumRuleUsage(tree, foreignKeys, reps, now); u.Used != "60%" || u.TopConsumer != "team-b/carol" || ptr.Deref(u.SubjectsAtLimit, -1) != 1 ||
		u.Windows[0].Used != "3 req" || u.Windows[0].TopConsumer != "team-b/carol" {
		t.Fatalf("a tenant's own budget shows its own subjects and their levels: %+v", u)
	}

	// A Redis fleet's monthly $50 cost: every replica reads the same counter.
	spend := budget("llm", "spend", twv1alpha1.TokenBudgetSpec{Dimension: twv1alpha1.DimensionGlobal, Amount: twv1alpha1.AmountCost,
		Windows: []twv1alpha1.BudgetWindow{{Limit: resource.MustParse("50"), Calendar: &twv1alpha1.CalendarWindow{Every: "Month"}}}})
	r := report.RuleUsage{Rule: "llm/spend", Calendar: true, InUse: 1, Top: []report.RuleTop{{Used: 12.5, Capacity: 50}}}
	u = sumRuleUsage(flat, spend, []indexedReport{replica(true, r), replica(true, r), replica(true, r)}, now)
	if u.Used != "25%" || u.Windows[0].Used != "$12.50" || u.Windows[0].Window != "$50/month" {
		t.Fatalf("calendar cost: %+v", u)
	}

	// A false report's refusal counts saturate rather than wrap below zero, which the
	// field would refuse.
	huge := report.RuleUsage{Rule: "llm/spend", Refused: math.MaxInt64 - 1}
	if u := sumRuleUsage(flat, spend, []indexedReport{replica(false, huge), replica(false, huge)}, now); u.Windows[0].Refused != math.MaxInt64 {
		t.Fatalf("saturated refusals: %+v", u.Windows[0])
	}

	// What a status write is worth for windows.
	have := u.DeepCopy()
	want := u.DeepCopy()
	want.Windows[0].UsedPercent = ptr.To(int32(29))
	if meaningful(have, want) {
		t.Error("4 points of a window written")
	}
	want.Windows[0].UsedPercent = ptr.To(int32(30))
	if !meaningful(have, want) {
		t.Error("5 points of a window not written")
	}
	want = u.DeepCopy()
	want.Windows[0].Refused = 1
	if !meaningful(have, want) {
		t.Error("a window's refusals that started not written")
	}
	if meaningful(nil, sumRuleUsage(flat, spend, []indexedReport{replica(true)}, now)) {
		t.Error("an unused rule budget is given a usage")
	}
}
