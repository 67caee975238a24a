// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package budget_test

import (
	"context"
	"fmt"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/proxy/budget/storetest"
	"github.com/tokenwarden/tokenwarden/proxy/config"
)

// explainPolicy is a fleet of two replicas: alice (team research) with a minute
// override of her own, batch (team batch) with a named rule of its own, and rules
// for teams, models and a warn rule.
func explainPolicy() *budget.Policy {
	GinkgoHelper()
	c, err := config.Parse([]byte(fmt.Sprintf(`
upstreams: [{name: default, url: "http://127.0.0.1:1"}]
api_keys:
- {name: alice, user: alice, team: research, key_sha256: "%064x", rate_limit_tokens_per_minute: 8000}
- {name: batch, user: batch, team: batch, key_sha256: "%064x"}
rate_limiting:
  budget_division: {replicas: 2}
  limits:
    global: {tokens_per_minute: 1000000}
    per_api_key: {requests_per_second: 10, tokens_per_minute: 20000, tokens_per_day: 1000000}
    per_team: {tokens_per_minute: 50000}
  rules:
  - {name: llm/research, dimension: team, subjects: [research], windows: [{limit: 40000, rolling: {period: minute}}]}
  - {name: llm/batch-minute, dimension: api_key, subjects: [batch], windows: [{limit: 6000, rolling: {period: minute}}]}
  - {name: llm/per-model, dimension: api_key, count_by: model, amount: requests, windows: [{limit: 100, rolling: {period: hour}}]}
  - {name: llm/watch, dimension: user, action: warn, windows: [{limit: 1000, rolling: {period: minute}}]}
`, 1, 2)))
	Expect(err).NotTo(HaveOccurred())
	return budget.NewPolicy(c)
}

// names are the budgets of an explanation, in order, as Replaced names them.
func names(e budget.Explanation) []string {
	var out []string
	for _, b := range e.Budgets {
		out = append(out, b.Name())
	}
	return out
}

var _ = Describe("Explain", func() {
	var (
		p   *budget.Policy
		l   *budget.Limiter
		ctx = context.Background()
	)
	BeforeEach(func() {
		p = explainPolicy()
		clock := storetest.NewClock()
		l = budget.NewLimiter(budget.NewMemory(clock, 1000), budget.NopRecorder{}, clock, false)
	})
	explain := func(key, model string, charged bool) budget.Explanation {
		return l.Explain(ctx, p, budget.Identity{Key: p.Key(key), Model: model}, charged)
	}

	It("lists every budget in the order it is reserved, with what the key's own replace", func() {
		e := explain("alice", "gpt-4o", true)
		Expect(names(e)).To(Equal([]string{
			"limits api_key second",
			"rule llm/per-model hour",
			"limits global minute",
			"the key's own minute limit",
			"limits api_key day",
			"rule llm/watch minute",
			"rule llm/research minute",
		}), "request counts first, then the dimensions in order; research's rule in place of per_team")
		Expect(e.Replaced).To(ConsistOf(
			budget.Replaced{What: "limits api_key minute", By: "the key's own minute limit"},
			budget.Replaced{What: "limits team minute", By: "rule llm/research minute"},
		))
		Expect(e.Budgets[6].Replaces).To(Equal([]string{"limits team minute"}))
		Expect(e.Budgets[3]).To(And(HaveField("Limit", 8000.0), HaveField("ReplicaLimit", 4000.0), HaveField("Own", true)),
			"her override, a fleet total, is halved on each of two replicas")
		Expect(e.Budgets[1]).To(And(HaveField("CountBy", "model"), HaveField("By", "gpt-4o"), HaveField("Subject", "alice")))
		Expect(e.Budgets[5].Warn).To(BeTrue())
		Expect(e.Levels).To(Equal("memory"))
	})

	It("shows a named rule of the key's own in place of its limit", func() {
		e := explain("batch", "gpt-4o", true)
		Expect(names(e)).To(ContainElement("rule llm/batch-minute minute"))
		Expect(names(e)).NotTo(ContainElement("limits api_key minute"))
		Expect(e.Replaced).To(ContainElement(budget.Replaced{What: "limits api_key minute", By: "rule llm/batch-minute minute"}))
		Expect(names(e)).To(ContainElement("limits team minute"), "team batch has no rule of its own")
	})

	It("reads each bucket's level: one request takes its amount from every budget listed", func() {
		before := explain("alice", "gpt-4o", true)
		for _, b := range before.Budgets {
			Expect(b.UsedPercent).To(HaveValue(BeNumerically("==", 0)), b.Name())
		}
		dec, err := l.Admit(ctx, p, budget.Identity{Key: p.Key("alice"), Model: "gpt-4o"}, budget.Ask{Input: 2000, Output: 1000})
		Expect(err).NotTo(HaveOccurred())
		Expect(dec.Refusal).To(BeNil())
		after := explain("alice", "gpt-4o", true)
		for i, b := range after.Budgets {
			took := *before.Budgets[i].Remaining - *b.Remaining
			switch {
			case b.Warn:
				Expect(took).To(BeNumerically("==", 0), "%s: a warn rule the request does not fit takes nothing", b.Name())
			case b.Amount == "requests":
				Expect(took).To(BeNumerically("~", 1, 0.01), b.Name())
			default:
				Expect(took).To(BeNumerically("~", 3000, 1), b.Name())
			}
		}
		Expect(after.Tightest).To(Equal(4), "3,000 of her 4,000 on this replica is the smallest share left")
	})

	It("lists only the request counts on a route that is not charged", func() {
		Expect(names(explain("alice", "gpt-4o", false))).To(Equal([]string{"limits api_key second", "rule llm/per-model hour"}))
	})

	It("says which dimensions it could not resolve, and that a bypass key has none", func() {
		Expect(explain("alice", "", true).Budgets).NotTo(ContainElement(HaveField("CountBy", "model")))
		c, err := config.Parse([]byte(fmt.Sprintf(`
upstreams: [{name: default, url: "http://127.0.0.1:1"}]
api_keys: [{name: ops, key_sha256: "%064x", bypass: true}]
rate_limiting:
  limits: {global: {tokens_per_minute: 1000}, per_client: {tokens_per_minute: 100}, per_model: {gpt-4o: {tokens_per_minute: 10}}}
`, 3)))
		Expect(err).NotTo(HaveOccurred())
		bp := budget.NewPolicy(c)
		e := l.Explain(ctx, bp, budget.Identity{Key: bp.Key("ops")}, true)
		Expect(e.Bypass).To(BeTrue())
		Expect(e.Budgets).To(BeEmpty())
		e = l.Explain(ctx, bp, budget.Identity{}, true)
		Expect(e.Unresolved).To(Equal([]string{"client", "model"}))
		Expect(names(e)).To(Equal([]string{"limits global minute"}))
	})

	It("lists a tenant's rules after the platform's, and never says a tenant's rule replaces the platform's", func() {
		tp := tenancyPolicy(`
  limits:
    per_team: {tokens_per_minute: 500}
  rules:
  - {name: team-a/teams, tenant: team-a, dimension: team, windows: [{limit: 100, rolling: {period: minute}}]}
  - {name: team-a/research, tenant: team-a, dimension: team, subjects: [team-a/research], windows: [{limit: 6000, rolling: {period: minute}}]}
`)
		e := l.Explain(ctx, tp, budget.Identity{Key: tp.Key("team-a_ci")}, true)
		Expect(names(e)).To(Equal([]string{"limits team minute", "rule team-a/research minute"}))
		Expect(e.Replaced).To(Equal([]budget.Replaced{{What: "rule team-a/teams minute", By: "rule team-a/research minute"}}),
			"the tenant's own rule replaces its each-team rule; the platform's 500 a team still holds")
	})
})
