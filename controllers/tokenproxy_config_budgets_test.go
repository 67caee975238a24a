// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package controllers_test

import (
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	twv1alpha1 "github.com/tokenwarden/tokenwarden/api/v1alpha1"
	"github.com/tokenwarden/tokenwarden/proxy/config"
)

// ruleBudget is a TokenBudget of fleet "fleet" in the rule shape.
func ruleBudget(ns, name string, dim twv1alpha1.Dimension, mutate func(*twv1alpha1.TokenBudgetSpec)) *twv1alpha1.TokenBudget {
	b := &twv1alpha1.TokenBudget{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec:       twv1alpha1.TokenBudgetSpec{ProxyRef: twv1alpha1.ProxyReference{Name: "fleet"}, Dimension: dim},
	}
	mutate(&b.Spec)
	return b
}

func rollingWindow(limit string, period twv1alpha1.Period, burstSeconds int64) twv1alpha1.BudgetWindow {
	return twv1alpha1.BudgetWindow{Limit: resource.MustParse(limit), Rolling: &twv1alpha1.RollingWindow{Period: period, BurstSeconds: burstSeconds}}
}

func calendarWindow(limit string, c twv1alpha1.CalendarWindow) twv1alpha1.BudgetWindow {
	return twv1alpha1.BudgetWindow{Limit: resource.MustParse(limit), Calendar: &c}
}

func windows(ws ...twv1alpha1.BudgetWindow) []twv1alpha1.BudgetWindow { return ws }

// redisFleet is fleetProxy on Redis storage, with priced models.
func redisFleet(ns string, replicas int32) *twv1alpha1.TokenProxy {
	tp := fleetProxy(ns, replicas)
	tp.Spec.Storage = twv1alpha1.StorageSpec{Type: twv1alpha1.StorageRedis, Redis: &twv1alpha1.RedisSpec{URL: "redis://redis.tokenwarden.svc:6379"}}
	tp.Spec.Models = []twv1alpha1.ModelSpec{
		{Name: "gpt-4o", Price: &twv1alpha1.ModelPrice{Input: resource.MustParse("2.50"), Output: resource.MustParse("10"), CachedInput: ptr.To(resource.MustParse("1.25"))}},
		{Name: "claude-sonnet", Price: &twv1alpha1.ModelPrice{Input: resource.MustParse("3"), Output: resource.MustParse("15")}},
	}
	tp.Spec.CachedInputWeight = ptr.To(resource.MustParse("0.1"))
	return tp
}

func budgetVerdict(g Gomega, ns, name string) verdict {
	return verdictOf(budgetStatus(g, ns, name).Conditions, "Accepted")
}

func rulesOf(g Gomega, ns string) []config.Rule { return rendered(g, ns).RateLimiting.Rules }

func ruleNames(rules []config.Rule) []string {
	names := make([]string, len(rules))
	for i, r := range rules {
		names[i] = r.Name
	}
	return names
}

// The sentences platform teams ask for (docs/budgets.md), each written as a TokenBudget,
// and the rule the proxy loads for it.
var _ = Describe("Budgets in the rule shape", func() {
	It("renders the sentences platform teams ask for into the rules the proxy loads", func() {
		ns := newNamespace("sentences")
		block, warn := config.ActionBlock, config.ActionWarn
		minute := func(limit float64, burst float64) config.Window {
			return config.Window{Limit: limit, Rolling: &config.Rolling{Period: config.PeriodMinute, BurstSeconds: burst}}
		}
		month := &config.Calendar{Every: config.EveryMonth}
		objects := []client.Object{
			// "Team research 600,000 tokens a minute, team support 100,000, every other team 50,000."
			ruleBudget(ns, "research", twv1alpha1.DimensionPerTeam, func(s *twv1alpha1.TokenBudgetSpec) {
				s.Subjects, s.Windows = []string{"research"}, windows(rollingWindow("600k", twv1alpha1.PeriodMinute, 0))
			}),
			ruleBudget(ns, "support", twv1alpha1.DimensionPerTeam, func(s *twv1alpha1.TokenBudgetSpec) {
				s.Subjects, s.Windows = []string{"support"}, windows(rollingWindow("100000", twv1alpha1.PeriodMinute, 0))
			}),
			ruleBudget(ns, "teams", twv1alpha1.DimensionPerTeam, func(s *twv1alpha1.TokenBudgetSpec) {
				s.Windows = windows(rollingWindow("50k", twv1alpha1.PeriodMinute, 0))
			}),
			// "$1,000 a month for team research, resetting at midnight Berlin time on the 1st."
			ruleBudget(ns, "research-dollars", twv1alpha1.DimensionPerTeam, func(s *twv1alpha1.TokenBudgetSpec) {
				s.Subjects, s.Amount = []string{"research"}, twv1alpha1.AmountCost
				s.Windows = windows(calendarWindow("1000", twv1alpha1.CalendarWindow{Every: twv1alpha1.EveryMonth, TimeZone: "Europe/Berlin", At: "00:00", DayOfMonth: 1}))
			}),
			// "50 requests a minute per key per model."
			ruleBudget(ns, "key-model-requests", twv1alpha1.DimensionPerAPIKey, func(s *twv1alpha1.TokenBudgetSpec) {
				s.CountBy, s.Amount = twv1alpha1.CountByModel, twv1alpha1.AmountRequests
				s.Windows = windows(rollingWindow("50", twv1alpha1.PeriodMinute, 0))
			}),
			// Input and output limits (Kuadrant #1654).
			ruleBudget(ns, "key-input", twv1alpha1.DimensionPerAPIKey, func(s *twv1alpha1.TokenBudgetSpec) {
				s.Amount, s.Windows = twv1alpha1.AmountInputTokens, windows(rollingWindow("400k", twv1alpha1.PeriodMinute, 0))
			}),
			ruleBudget(ns, "key-output", twv1alpha1.DimensionPerAPIKey, func(s *twv1alpha1.TokenBudgetSpec) {
				s.Amount, s.Windows = twv1alpha1.AmountOutputTokens, windows(rollingWindow("100k", twv1alpha1.PeriodMinute, 0))
			}),
			// "$25 a month per key on gpt-4o", a calendar month from the 1st, 00:00 UTC.
			ruleBudget(ns, "key-gpt-4o-dollars", twv1alpha1.DimensionPerAPIKey, func(s *twv1alpha1.TokenBudgetSpec) {
				s.Models, s.Amount = []string{"gpt-4o"}, twv1alpha1.AmountCost
				s.Windows = windows(calendarWindow("25", twv1alpha1.CalendarWindow{Every: twv1alpha1.EveryMonth}))
			}),
			// The lab's mission two: 200,000 tokens a minute per app, with a 20-second bucket.
			ruleBudget(ns, "app-burst", twv1alpha1.DimensionPerAPIKey, func(s *twv1alpha1.TokenBudgetSpec) {
				s.Windows = windows(rollingWindow("200k", twv1alpha1.PeriodMinute, 20))
			}),
			// A budget watched before it is enforced.
			ruleBudget(ns, "users-shadow", twv1alpha1.DimensionPerUser, func(s *twv1alpha1.TokenBudgetSpec) {
				s.Action, s.Windows = twv1alpha1.ActionWarn, windows(rollingWindow("1M", twv1alpha1.PeriodDay, 0))
			}),
			// A key named by namespace/name, as a budget of another namespace would.
			ruleBudget(ns, "alice-output", twv1alpha1.DimensionPerAPIKey, func(s *twv1alpha1.TokenBudgetSpec) {
				s.Subjects, s.Amount = []string{ns + "/alice"}, twv1alpha1.AmountOutputTokens
				s.Windows = windows(rollingWindow("1M", twv1alpha1.PeriodDay, 0))
			}),
			// The shorthand fields on a rule-shaped budget: two amounts, two rules.
			ruleBudget(ns, "batch", twv1alpha1.DimensionPerTeam, func(s *twv1alpha1.TokenBudgetSpec) {
				s.Subjects, s.TokensPerMinute, s.RequestsPerSecond, s.BurstCapacity = []string{"batch"}, 30000, 5, 10
			}),
			// The limits shape beside them: still the config's limits.
			tokenBudget(ns, "global", twv1alpha1.DimensionGlobal, "", 1000000, 0),
			keySecret(ns, "alice", "sk-alice"),
			func() client.Object {
				k := apiKey(ns, "alice", "alice", "alice", "research")
				k.Spec.TokensPerMinute, k.Spec.TokensPerDay = 90000, 500000
				return k
			}(),
			redisFleet(ns, 2),
		}
		for _, o := range objects {
			Expect(k8sClient.Create(ctx, o)).To(Succeed(), o.GetName())
		}

		want := []config.Rule{
			{Name: ns + "/alice-output", Dimension: config.RuleAPIKey, Subjects: []string{"alice"}, Amount: config.AmountOutputTokens, Action: block,
				Windows: []config.Window{{Limit: 1000000, Rolling: &config.Rolling{Period: config.PeriodDay}}}},
			{Name: ns + "/app-burst", Dimension: config.RuleAPIKey, Amount: config.AmountTokens, Action: block, Windows: []config.Window{minute(200000, 20)}},
			{Name: ns + "/batch", Dimension: config.RuleTeam, Subjects: []string{"batch"}, Amount: config.AmountTokens, Action: block,
				Windows: []config.Window{minute(30000, 0)}},
			{Name: ns + "/batch/requests", Dimension: config.RuleTeam, Subjects: []string{"batch"}, Amount: config.AmountRequests, Action: block,
				Windows: []config.Window{{Limit: 5, Rolling: &config.Rolling{Period: config.PeriodSecond, BurstSeconds: 2}}}},
			{Name: ns + "/key-gpt-4o-dollars", Dimension: config.RuleAPIKey, Models: []string{"gpt-4o"}, Amount: config.AmountCost, Action: block,
				Windows: []config.Window{{Limit: 25, Calendar: month}}},
			{Name: ns + "/key-input", Dimension: config.RuleAPIKey, Amount: config.AmountInputTokens, Action: block, Windows: []config.Window{minute(400000, 0)}},
			{Name: ns + "/key-model-requests", Dimension: config.RuleAPIKey, CountBy: config.RuleModel, Amount: config.AmountRequests, Action: block,
				Windows: []config.Window{minute(50, 0)}},
			{Name: ns + "/key-output", Dimension: config.RuleAPIKey, Amount: config.AmountOutputTokens, Action: block, Windows: []config.Window{minute(100000, 0)}},
			{Name: ns + "/research", Dimension: config.RuleTeam, Subjects: []string{"research"}, Amount: config.AmountTokens, Action: block,
				Windows: []config.Window{minute(600000, 0)}},
			{Name: ns + "/research-dollars", Dimension: config.RuleTeam, Subjects: []string{"research"}, Amount: config.AmountCost, Action: block,
				Windows: []config.Window{{Limit: 1000, Calendar: &config.Calendar{Every: config.EveryMonth, TimeZone: "Europe/Berlin", At: "00:00", DayOfMonth: 1}}}},
			{Name: ns + "/support", Dimension: config.RuleTeam, Subjects: []string{"support"}, Amount: config.AmountTokens, Action: block,
				Windows: []config.Window{minute(100000, 0)}},
			{Name: ns + "/teams", Dimension: config.RuleTeam, Amount: config.AmountTokens, Action: block, Windows: []config.Window{minute(50000, 0)}},
			{Name: ns + "/users-shadow", Dimension: config.RuleUser, Amount: config.AmountTokens, Action: warn,
				Windows: []config.Window{{Limit: 1000000, Rolling: &config.Rolling{Period: config.PeriodDay}}}},
		}
		Eventually(func(g Gomega) {
			c := rendered(g, ns)
			g.Expect(c.RateLimiting.Rules).To(Equal(want))
			g.Expect(c.RateLimiting.Limits.Global.TokensPerMinute).To(Equal(int64(1000000)), "the limits shape stays in limits")
			g.Expect(c.RateLimiting.Limits.PerTeam).To(Equal(config.DimensionLimits{}))
			g.Expect(c.APIKeys).To(ConsistOf(HaveField("RateLimitTokensPerDay", int64(500000))))
			g.Expect(c.Models).To(Equal([]config.Model{
				{Name: "gpt-4o", Price: &config.Price{Input: 2.5, Output: 10, CachedInput: ptr.To(1.25)}},
				{Name: "claude-sonnet", Price: &config.Price{Input: 3, Output: 15}},
			}))
			g.Expect(c.RateLimiting.CachedWeight()).To(Equal(0.1))
		}).Should(Succeed())

		By("describing each budget in words for kubectl get")
		Eventually(func(g Gomega) {
			g.Expect(budgetStatus(g, ns, "research-dollars").Summary).To(Equal(twv1alpha1.BudgetSummary{
				Subjects: "research", Amount: "cost", Windows: "$1000/month Europe/Berlin", Action: "Block", PerReplica: "$1000/month Europe/Berlin"}))
			g.Expect(budgetStatus(g, ns, "key-model-requests").Summary).To(Equal(twv1alpha1.BudgetSummary{
				Subjects: "each key per model", CountBy: "model", Amount: "requests", Windows: "50 req/min", Action: "Block", PerReplica: "50 req/min"}))
			g.Expect(budgetStatus(g, ns, "key-gpt-4o-dollars").Summary.Subjects).To(Equal("each key on gpt-4o"))
			g.Expect(budgetStatus(g, ns, "app-burst").Summary.Windows).To(Equal("200k/min burst 20s"))
			g.Expect(budgetStatus(g, ns, "users-shadow").Summary.Action).To(Equal("Warn"))
			g.Expect(budgetStatus(g, ns, "batch").Summary).To(Equal(twv1alpha1.BudgetSummary{
				Subjects: "batch", Amount: "tokens, requests", Windows: "30k/min, 5 req/s burst 2s", Action: "Block", PerReplica: "30k/min, 5 req/s burst 2s"}))
			g.Expect(budgetStatus(g, ns, "global").Summary).To(Equal(twv1alpha1.BudgetSummary{
				Subjects: "fleet", Amount: "tokens", Windows: "1M/min", Action: "Block", PerReplica: "1M/min"}))
			st := budgetStatus(g, ns, "teams")
			g.Expect(st.Replicas).To(Equal(int64(1)), "Redis: the replicas share the fleet total")
			g.Expect(st.PerReplica.TokensPerMinute).To(HaveValue(Equal(int64(50000))))
			g.Expect(condition(st.Conditions, "Ready").Status).To(Equal(metav1.ConditionTrue))
		}).Should(Succeed())
	})

	It("divides rolling windows under memory storage, and refuses a calendar or cost budget there until the fleet moves to Redis", func() {
		ns := newNamespace("needsredis")
		Expect(k8sClient.Create(ctx, ruleBudget(ns, "teams", twv1alpha1.DimensionPerTeam, func(s *twv1alpha1.TokenBudgetSpec) {
			s.Windows = windows(rollingWindow("50k", twv1alpha1.PeriodMinute, 20), rollingWindow("1000", twv1alpha1.PeriodHour, 0))
		}))).To(Succeed())
		Expect(k8sClient.Create(ctx, ruleBudget(ns, "monthly", twv1alpha1.DimensionPerTeam, func(s *twv1alpha1.TokenBudgetSpec) {
			s.Windows = windows(calendarWindow("50M", twv1alpha1.CalendarWindow{Every: twv1alpha1.EveryMonth}))
		}))).To(Succeed())
		// Refused first for another reason: the NeedsRedis event still comes when the
		// reason changes.
		Eventually(func(g Gomega) {
			g.Expect(budgetVerdict(g, ns, "monthly").Reason).To(Equal(twv1alpha1.ReasonProxyNotFound))
		}).Should(Succeed())
		Expect(k8sClient.Create(ctx, fleetProxy(ns, 3))).To(Succeed())
		Eventually(func(g Gomega) {
			g.Expect(budgetVerdict(g, ns, "monthly")).To(Equal(verdict{metav1.ConditionFalse, "NeedsRedis",
				"A calendar window or a Cost amount must never reset to full because a proxy restarted, so it needs a fleet with Redis storage, " +
					"and TokenProxy fleet uses Memory storage: set the TokenProxy's spec.storage.type to Redis, or use rolling windows of tokens or requests"}))
			g.Expect(verdictOf(budgetStatus(g, ns, "monthly").Conditions, "Ready").Status).To(Equal(metav1.ConditionFalse))
			g.Expect(budgetStatus(g, ns, "monthly").Summary.Windows).To(Equal("50M/month"))
			g.Expect(budgetStatus(g, ns, "monthly").Summary.PerReplica).To(BeEmpty(), "not in force")
			g.Expect(ruleNames(rulesOf(g, ns))).To(Equal([]string{ns + "/teams"}))
			st := budgetStatus(g, ns, "teams")
			g.Expect(st.Summary.Windows).To(Equal("50k/min burst 20s, 1k/h"))
			g.Expect(st.Summary.PerReplica).To(Equal("16666/min burst 20s, 333/h"), "each of 3 replicas enforces a third")
			g.Expect(st.PerReplica.TokensPerMinute).To(HaveValue(Equal(int64(16666))))
			g.Expect(warningReasons(g, ns)).To(ContainElement("NeedsRedis"))
		}).Should(Succeed())

		By("the fleet moving to Redis storage")
		var tp twv1alpha1.TokenProxy
		Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: "fleet"}, &tp)).To(Succeed())
		patch := client.MergeFrom(tp.DeepCopy())
		tp.Spec.Storage = twv1alpha1.StorageSpec{Type: twv1alpha1.StorageRedis, Redis: &twv1alpha1.RedisSpec{URL: "redis://redis:6379"}}
		Expect(k8sClient.Patch(ctx, &tp, patch)).To(Succeed())
		Eventually(func(g Gomega) {
			g.Expect(budgetVerdict(g, ns, "monthly").Reason).To(Equal("Accepted"))
			g.Expect(ruleNames(rulesOf(g, ns))).To(Equal([]string{ns + "/monthly", ns + "/teams"}))
			g.Expect(budgetStatus(g, ns, "teams").Summary.PerReplica).To(Equal("50k/min burst 20s, 1k/h"), "the replicas share the total")
		}).Should(Succeed())
	})

	It("refuses on the budget a cost budget for a model without a price, and a rule the proxy would refuse, saying what to do", func() {
		ns := newNamespace("unpriced")
		Expect(k8sClient.Create(ctx, ruleBudget(ns, "o3-dollars", twv1alpha1.DimensionPerAPIKey, func(s *twv1alpha1.TokenBudgetSpec) {
			s.Models, s.Amount = []string{"o3", "gpt-4o"}, twv1alpha1.AmountCost
			s.Windows = windows(calendarWindow("25.50", twv1alpha1.CalendarWindow{Every: twv1alpha1.EveryMonth}))
		}))).To(Succeed())
		Expect(k8sClient.Create(ctx, ruleBudget(ns, "mars", twv1alpha1.DimensionGlobal, func(s *twv1alpha1.TokenBudgetSpec) {
			s.Windows = windows(calendarWindow("1G", twv1alpha1.CalendarWindow{Every: twv1alpha1.EveryDay, TimeZone: "Mars/Olympus_Mons"}))
		}))).To(Succeed())
		Expect(k8sClient.Create(ctx, ruleBudget(ns, "teams", twv1alpha1.DimensionPerTeam, func(s *twv1alpha1.TokenBudgetSpec) {
			s.Windows = windows(rollingWindow("50k", twv1alpha1.PeriodMinute, 0))
		}))).To(Succeed())
		Expect(k8sClient.Create(ctx, credentialSecret(ns, "provider", map[string]string{"anthropic": "upstream"}))).To(Succeed())
		tp := redisFleet(ns, 1)
		Expect(k8sClient.Create(ctx, tp)).To(Succeed())
		Eventually(func(g Gomega) {
			g.Expect(budgetVerdict(g, ns, "o3-dollars")).To(Equal(verdict{metav1.ConditionFalse, "ModelNotPriced",
				`A Cost budget counts US dollars at its models' prices, and TokenProxy fleet has no price for model "o3": ` +
					"add it with a price to the TokenProxy's spec.models, or remove it from this budget"}))
			g.Expect(budgetVerdict(g, ns, "mars")).To(Equal(verdict{metav1.ConditionFalse, "InvalidBudget",
				`The proxy would refuse this budget: spec.windows[0].calendar.timeZone: not an IANA time zone: "Mars/Olympus_Mons"`}))
			g.Expect(ruleNames(rulesOf(g, ns))).To(Equal([]string{ns + "/teams"}), "the fleet enforces the rest")
			g.Expect(condition(proxyStatus(g, ns).Conditions, "Accepted").Status).To(Equal(metav1.ConditionTrue))
		}).Should(Succeed())

		By("a price for o3 on the fleet")
		Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(tp), tp)).To(Succeed())
		patch := client.MergeFrom(tp.DeepCopy())
		tp.Spec.Models = append(tp.Spec.Models, twv1alpha1.ModelSpec{Name: "o3", Price: &twv1alpha1.ModelPrice{Input: resource.MustParse("2"), Output: resource.MustParse("8")}})
		Expect(k8sClient.Patch(ctx, tp, patch)).To(Succeed())
		Eventually(func(g Gomega) {
			g.Expect(budgetVerdict(g, ns, "o3-dollars").Reason).To(Equal("Accepted"))
			rules := rulesOf(g, ns)
			g.Expect(ruleNames(rules)).To(Equal([]string{ns + "/o3-dollars", ns + "/teams"}))
			g.Expect(rules[0].Windows[0].Limit).To(Equal(25.5))
			g.Expect(budgetStatus(g, ns, "o3-dollars").Summary.Windows).To(Equal("$25.50/month"))
		}).Should(Succeed())
	})

	It("keeps the oldest of two budgets on one counter and marks the other Conflicted; a named budget and an each-subject one are precedence", func() {
		ns := newNamespace("ruleconflict")
		minuteBudget := func(name string, subjects []string, limit string) *twv1alpha1.TokenBudget {
			return ruleBudget(ns, name, twv1alpha1.DimensionPerTeam, func(s *twv1alpha1.TokenBudgetSpec) {
				s.Subjects, s.Windows = subjects, windows(rollingWindow(limit, twv1alpha1.PeriodMinute, 0))
			})
		}
		// Created in the order of their names: the older one, or at the same second the
		// one whose name sorts first, wins.
		for _, b := range []*twv1alpha1.TokenBudget{
			minuteBudget("a-teams", nil, "50k"),
			minuteBudget("b-teams", nil, "80k"),
			minuteBudget("c-research", []string{"research"}, "600k"),
			minuteBudget("d-research-support", []string{"support", "research"}, "1M"),
			tokenBudget(ns, "e-legacy", twv1alpha1.DimensionPerTeam, "", 70000, 0),
			ruleBudget(ns, "f-research-day", twv1alpha1.DimensionPerTeam, func(s *twv1alpha1.TokenBudgetSpec) {
				s.Subjects, s.Windows = []string{"research"}, windows(rollingWindow("5M", twv1alpha1.PeriodDay, 0))
			}),
			ruleBudget(ns, "g-teams-warn", twv1alpha1.DimensionPerTeam, func(s *twv1alpha1.TokenBudgetSpec) {
				s.Action, s.Windows = twv1alpha1.ActionWarn, windows(rollingWindow("40k", twv1alpha1.PeriodMinute, 0))
			}),
			ruleBudget(ns, "h-teams-input", twv1alpha1.DimensionPerTeam, func(s *twv1alpha1.TokenBudgetSpec) {
				s.Amount, s.Windows = twv1alpha1.AmountInputTokens, windows(rollingWindow("40k", twv1alpha1.PeriodMinute, 0))
			}),
		} {
			Expect(k8sClient.Create(ctx, b)).To(Succeed())
		}
		Expect(k8sClient.Create(ctx, fleetProxy(ns, 1))).To(Succeed())
		Eventually(func(g Gomega) {
			g.Expect(budgetVerdict(g, ns, "b-teams")).To(Equal(verdict{metav1.ConditionFalse, "Conflicted",
				"TokenBudget a-teams is older and sets the same budget: each team, tokens per minute"}))
			g.Expect(budgetVerdict(g, ns, "d-research-support")).To(Equal(verdict{metav1.ConditionFalse, "Conflicted",
				"TokenBudget c-research is older and sets the same budget: team research, tokens per minute"}))
			g.Expect(budgetVerdict(g, ns, "e-legacy")).To(Equal(verdict{metav1.ConditionFalse, "Conflicted",
				"TokenBudget a-teams is older and sets the same budget: each team, tokens per minute"}))
			for _, accepted := range []string{"a-teams", "c-research", "f-research-day", "g-teams-warn", "h-teams-input"} {
				g.Expect(budgetVerdict(g, ns, accepted).Reason).To(Equal("Accepted"), accepted)
			}
			g.Expect(ruleNames(rulesOf(g, ns))).To(Equal([]string{ns + "/a-teams", ns + "/c-research", ns + "/f-research-day", ns + "/g-teams-warn", ns + "/h-teams-input"}))
			g.Expect(rendered(g, ns).RateLimiting.Limits.PerTeam.TokensPerMinute).To(BeZero())
		}).Should(Succeed())

		By("the oldest leaving: the next oldest takes its counter")
		Expect(k8sClient.Delete(ctx, minuteBudget("a-teams", nil, "50k"))).To(Succeed())
		Eventually(func(g Gomega) {
			g.Expect(budgetVerdict(g, ns, "b-teams").Reason).To(Equal("Accepted"))
			g.Expect(budgetVerdict(g, ns, "e-legacy")).To(Equal(verdict{metav1.ConditionFalse, "Conflicted",
				"TokenBudget b-teams is older and sets the same budget: each team, tokens per minute"}))
			g.Expect(ruleNames(rulesOf(g, ns))).To(ContainElement(ns + "/b-teams"))
		}).Should(Succeed())
	})

	It("shows subjects, amount, windows and each replica's allowance in kubectl get", func() {
		ns := newNamespace("kubectlrules")
		for _, o := range []client.Object{
			ruleBudget(ns, "research", twv1alpha1.DimensionPerTeam, func(s *twv1alpha1.TokenBudgetSpec) {
				s.Subjects = []string{"research", "support"}
				s.Windows = windows(rollingWindow("600k", twv1alpha1.PeriodMinute, 20))
			}),
			ruleBudget(ns, "research-dollars", twv1alpha1.DimensionPerTeam, func(s *twv1alpha1.TokenBudgetSpec) {
				s.Subjects, s.Amount = []string{"research"}, twv1alpha1.AmountCost
				s.Windows = windows(rollingWindow("100", twv1alpha1.PeriodHour, 0), calendarWindow("1000", twv1alpha1.CalendarWindow{Every: twv1alpha1.EveryMonth}))
			}),
			ruleBudget(ns, "users-shadow", twv1alpha1.DimensionPerUser, func(s *twv1alpha1.TokenBudgetSpec) {
				s.Action, s.CountBy = twv1alpha1.ActionWarn, twv1alpha1.CountByModel
				s.Windows = windows(rollingWindow("1M", twv1alpha1.PeriodDay, 0))
			}),
			tokenBudget(ns, "team", twv1alpha1.DimensionPerTeam, "", 120000, 2400000),
			redisFleet(ns, 3),
		} {
			Expect(k8sClient.Create(ctx, o)).To(Succeed())
		}
		Eventually(func(g Gomega) {
			g.Expect(budgetStatus(g, ns, "users-shadow").Summary.PerReplica).NotTo(BeEmpty())
			g.Expect(budgetStatus(g, ns, "team").Summary.PerReplica).NotTo(BeEmpty())
		}).Should(Succeed())
		rows := table(kubectl("get", "tokenbudgets", "-n", ns))
		Expect(rows[0]).To(Equal([]string{"NAME", "DIMENSION", "SUBJECTS", "APPLIES WHEN", "COUNT BY", "AMOUNT", "WINDOWS", "ACTION", "REPLICAS", "PER-REPLICA", "READY", "USED", "AT LIMIT", "SPENT", "PROJECTED", "AGE"}))
		Expect(rows[1][:11]).To(Equal([]string{"research", "PerTeam", "research,support", "", "", "tokens", "600k/min burst 20s", "Block", "1", "600k/min burst 20s", "True"}))
		Expect(rows[2][:11]).To(Equal([]string{"research-dollars", "PerTeam", "research", "", "", "cost", "$100/h, $1000/month", "Block", "1", "$100/h, $1000/month", "True"}))
		Expect(rows[3][:11]).To(Equal([]string{"team", "PerTeam", "each team", "", "", "tokens", "120k/min, 2.4M/day", "Block", "1", "120k/min, 2.4M/day", "True"}))
		Expect(rows[4][:11]).To(Equal([]string{"users-shadow", "PerUser", "each user per model", "", "model", "tokens", "1M/day", "Warn", "1", "1M/day", "True"}))

		By("the limits shape's columns in the wide output")
		wide := table(kubectl("get", "tokenbudgets", "-n", ns, "-o", "wide"))
		Expect(wide[0][16:]).To(Equal([]string{"TOP CONSUMER", "RUNS OUT", "RESETS", "MODEL", "TPM", "TPD", "PER-REPLICA TPM", "PER-REPLICA TPD"}))
		Expect(wide[3][20:]).To(Equal([]string{"120000", "2400000", "120000", "2400000"}))
	})
})

// table splits kubectl's table output into cells at the columns of its header (a
// cell may hold spaces: "each team"); trailing empty cells are dropped.
func table(out string) [][]string {
	GinkgoHelper()
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	header := lines[0]
	var starts []int
	for i := 0; i < len(header); i++ {
		// A column starts after two spaces or at 0; "PER-REPLICA TPM" holds one.
		if header[i] != ' ' && (i == 0 || (i >= 2 && header[i-1] == ' ' && header[i-2] == ' ')) {
			starts = append(starts, i)
		}
	}
	rows := make([][]string, 0, len(lines))
	for _, l := range lines {
		var row []string
		for j, s := range starts {
			end := len(l)
			if j+1 < len(starts) && starts[j+1] < end {
				end = starts[j+1]
			}
			cell := ""
			if s < len(l) {
				cell = strings.TrimSpace(l[s:end])
			}
			row = append(row, cell)
		}
		for len(row) > 0 && row[len(row)-1] == "" {
			row = row[:len(row)-1]
		}
		rows = append(rows, row)
	}
	return rows
}
