// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package controllers_test

import (
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	twv1alpha1 "github.com/tokenwarden/tokenwarden/api/v1alpha1"
)

var _ = Describe("Live usage of rule-shaped budgets", func() {
	It("shows in kubectl get each rule budget's use, subjects at their limit and top consumer, and in describe each window's refusals", func() {
		ns := newNamespace("rule-usage")
		for _, k := range []string{"alice", "bob"} {
			Expect(k8sClient.Create(ctx, keySecret(ns, k, "sk-"+k))).To(Succeed())
			Expect(k8sClient.Create(ctx, apiKey(ns, k, k, k, "research"))).To(Succeed())
		}
		window := func(limit string, p twv1alpha1.Period) twv1alpha1.BudgetWindow {
			return twv1alpha1.BudgetWindow{Limit: resource.MustParse(limit), Rolling: &twv1alpha1.RollingWindow{Period: p}}
		}
		// The research team's tokens: a minute window and a day window (whose refill,
		// a tenth of a token a second, moves no figure while the spec reads it).
		Expect(k8sClient.Create(ctx, &twv1alpha1.TokenBudget{ObjectMeta: metav1.ObjectMeta{Name: "research", Namespace: ns},
			Spec: twv1alpha1.TokenBudgetSpec{ProxyRef: twv1alpha1.ProxyReference{Name: "fleet"}, Dimension: twv1alpha1.DimensionPerTeam,
				Subjects: []string{"research"},
				Windows:  []twv1alpha1.BudgetWindow{window("60k", twv1alpha1.PeriodMinute), window("10k", twv1alpha1.PeriodDay)}}})).To(Succeed())
		// Three requests a day for each key.
		Expect(k8sClient.Create(ctx, &twv1alpha1.TokenBudget{ObjectMeta: metav1.ObjectMeta{Name: "requests", Namespace: ns},
			Spec: twv1alpha1.TokenBudgetSpec{ProxyRef: twv1alpha1.ProxyReference{Name: "fleet"}, Dimension: twv1alpha1.DimensionPerAPIKey,
				Amount: twv1alpha1.AmountRequests, Windows: []twv1alpha1.BudgetWindow{window("3", twv1alpha1.PeriodDay)}}})).To(Succeed())
		url := usageProxy(ns)

		// Each answer reports 1,500 tokens: alice's fourth request finds her requests
		// spent; bob has one of his three.
		for range 3 {
			Expect(chat(url, "sk-alice", "m")).To(Equal(200))
		}
		Expect(chat(url, "sk-alice", "m")).To(Equal(429))
		Expect(chat(url, "sk-bob", "m")).To(Equal(200))

		Eventually(func(g Gomega) {
			rq := getColumns(g, ns, "requests")
			g.Expect(rq).To(HaveKeyWithValue("USED", "100%"), "alice used all of her requests")
			g.Expect(rq).To(HaveKeyWithValue("AT LIMIT", "1"))
			g.Expect(rq).To(HaveKeyWithValue("TOP CONSUMER", "alice"))
			rs := getColumns(g, ns, "research")
			g.Expect(rs).To(HaveKeyWithValue("USED", "60%"), "6,000 of the team's 10,000 tokens a day")
			g.Expect(rs).To(HaveKeyWithValue("AT LIMIT", ""), "one counter: no subjects")
			g.Expect(rs).To(HaveKeyWithValue("TOP CONSUMER", ""))
			w := budgetStatus(g, ns, "research").Usage.Windows
			g.Expect(w).To(HaveLen(2))
			g.Expect(w[0].Window).To(Equal("60k/min"))
			g.Expect(w[0].UsedPercent).To(HaveValue(BeNumerically("<=", 10)), "at most 6,000 of 60,000, refilling")
			g.Expect(w[1]).To(Equal(twv1alpha1.WindowUsage{Window: "10k/day", UsedPercent: ptr.To(int32(60)), Used: "6k"}))
		}, enforceTimeout).Should(Succeed())

		// describe: the window's refusals over the last interval, while alice keeps
		// asking.
		Eventually(func(g Gomega) {
			g.Expect(chat(url, "sk-alice", "m")).To(Equal(429))
			out := kubectl("describe", "tokenbudget", "requests", "-n", ns)
			g.Expect(out).To(MatchRegexp(`(?s)Usage:.*Windows:\s+Refused:\s+[1-9][0-9]*\s+Subjects At Limit:\s+1\s+Top Consumer:\s+alice\s+Used:\s+3 req\s+Used Percent:\s+100\s+Window:\s+3 req/day\s`))
		}, enforceTimeout).Should(Succeed())
	})
})
