// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package controllers_test

import (
	"strconv"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	twv1alpha1 "github.com/tokenwarden/tokenwarden/api/v1alpha1"
	"github.com/tokenwarden/tokenwarden/proxy/report"
)

var _ = Describe("The forecast of a calendar budget", func() {
	It("shows the window's spend and projection in status, kubectl get, a ProjectedToRunOut condition and event", func() {
		ns := newNamespace("forecast")
		Expect(k8sClient.Create(ctx, redisFleet(ns, 1))).To(Succeed())
		Expect(k8sClient.Create(ctx, &twv1alpha1.TokenBudget{ObjectMeta: metav1.ObjectMeta{Name: "dollars", Namespace: ns},
			Spec: twv1alpha1.TokenBudgetSpec{ProxyRef: twv1alpha1.ProxyReference{Name: "fleet"}, Dimension: twv1alpha1.DimensionGlobal,
				Amount: twv1alpha1.AmountCost, Windows: windows(calendarWindow("1000", twv1alpha1.CalendarWindow{Every: twv1alpha1.EveryMonth}))}})).To(Succeed())
		Eventually(func(g Gomega) {
			g.Expect(budgetVerdict(g, ns, "dollars").Status).To(Equal(metav1.ConditionTrue))
		}, enforceTimeout).Should(Succeed())

		// The test plays the replica: its report Lease reads the shared counter.
		le := replicaLease(ns, "0", 1, "d", time.Now(), 10*time.Minute)
		spend := func(dollars float64) {
			GinkgoHelper()
			u := report.Usage{Window: 60, Shared: true, Rules: []report.RuleUsage{{Rule: ns + "/dollars", Calendar: true, InUse: 1,
				Top: []report.RuleTop{{Used: dollars, Capacity: 1000}}}}}
			Eventually(func() error {
				var cur = le.DeepCopy()
				if err := k8sClient.Get(ctx, client.ObjectKeyFromObject(le), cur); err != nil {
					cur.Annotations[twv1alpha1.ReplicaUsageAnnotation] = u.Encode()
					return k8sClient.Create(ctx, cur)
				}
				cur.Annotations[twv1alpha1.ReplicaUsageAnnotation] = u.Encode()
				return k8sClient.Update(ctx, cur)
			}).Should(Succeed())
		}
		spend(500)
		Eventually(func(g Gomega) {
			st := budgetStatus(g, ns, "dollars")
			g.Expect(st.Forecast).NotTo(BeNil())
			g.Expect(st.Forecast.Spent).To(Equal("$500.00"))
			g.Expect(st.Forecast.SpentPercent).To(Equal(int32(50)))
			g.Expect(st.Forecast.Projected).To(BeEmpty(), "one sample: no burn rate yet")
			g.Expect(verdictOf(st.Conditions, twv1alpha1.ConditionProjectedToRunOut).Reason).To(Equal(twv1alpha1.ReasonCollectingSamples), "%+v", st)
			cols := getColumns(g, ns, "dollars")
			g.Expect(cols).To(HaveKeyWithValue("SPENT", "$500.00"))
			g.Expect(cols).To(HaveKeyWithValue("PROJECTED", ""))
		}, enforceTimeout).Should(Succeed())
		Expect(warningReasons(Default, ns)).NotTo(ContainElement(twv1alpha1.ReasonProjectedToRunOut))

		// An hour ago the operator saw $10 of this window spent: $490 in the last hour,
		// and then $600 spent now ($590 an hour) runs out within the hour.
		var b twv1alpha1.TokenBudget
		Eventually(func() error {
			if err := k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: "dollars"}, &b); err != nil {
				return err
			}
			s := b.Status.Forecast.Samples[0]
			b.Status.Forecast.Samples = []twv1alpha1.SpendSample{{At: metav1.NewTime(time.Now().Add(-time.Hour)), WindowStart: s.WindowStart, SpentMicros: 10e6}}
			return k8sClient.Status().Update(ctx, &b)
		}).Should(Succeed())
		spend(600)
		Eventually(func(g Gomega) {
			st := budgetStatus(g, ns, "dollars")
			g.Expect(st.Forecast.Spent).To(Equal("$600.00"))
			g.Expect(st.Forecast.LookbackSeconds).To(BeNumerically("~", 3600, 60))
			g.Expect(st.Forecast.RunsOutAt).NotTo(BeNil())
			g.Expect(st.Forecast.RunsOutAt.Time).To(BeTemporally("<", st.Forecast.ResetsAt.Time))
			g.Expect(st.Forecast.RunsOutAt.Time).To(BeTemporally("~", time.Now().Add(40*time.Minute), 5*time.Minute), "$400 left at $590/h")
			c := condition(st.Conditions, twv1alpha1.ConditionProjectedToRunOut)
			g.Expect(c.Status).To(Equal(metav1.ConditionTrue))
			g.Expect(c.Message).To(ContainSubstring("$600.00 of $1000/month spent at $5"))
			g.Expect(condition(st.Conditions, twv1alpha1.ConditionAccepted).Status).To(Equal(metav1.ConditionTrue), "the other conditions stay")
			g.Expect(warningReasons(g, ns)).To(ContainElement(twv1alpha1.ReasonProjectedToRunOut))
			cols := getColumns(g, ns, "dollars")
			g.Expect(cols).To(HaveKeyWithValue("SPENT", "$600.00"))
			g.Expect(cols["PROJECTED"]).To(MatchRegexp(`^\$[0-9]+\.[0-9]{2} \([0-9]+%\)$`))
			g.Expect(cols["RUNS OUT"]).To(Equal(st.Forecast.RunsOutAt.UTC().Format(time.RFC3339)))
		}, enforceTimeout).Should(Succeed())

		// The default columns stay readable: the run-out and reset times are -o wide's.
		rows := table(kubectl("get", "tb", "-n", ns))
		Expect(rows[0]).To(ContainElements("SPENT", "PROJECTED"))
		Expect(rows[0]).NotTo(ContainElement("RUNS OUT"))

		// Spending on while the projection holds records no second event.
		spend(700)
		Eventually(func(g Gomega) {
			g.Expect(budgetStatus(g, ns, "dollars").Forecast.Spent).To(Equal("$700.00"))
		}, enforceTimeout).Should(Succeed())
		var evs corev1.EventList
		Expect(k8sClient.List(ctx, &evs, client.InNamespace(ns))).To(Succeed())
		n := 0
		for _, e := range evs.Items {
			if e.Reason == twv1alpha1.ReasonProjectedToRunOut {
				n++
				Expect(e.Count).To(BeNumerically("<=", 1), strconv.Itoa(int(e.Count)))
			}
		}
		Expect(n).To(Equal(1))
	})
})
