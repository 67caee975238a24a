// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package budget_test

import (
	"fmt"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/proxy/config"
)

// tenancyPolicy is a fleet with a platform key (ops, team research) and two tenants,
// team-a and team-b, each with two keys as the operator renders them: named
// <tenant>_<name>, their team and user qualified by their tenant.
func tenancyPolicy(rateLimiting string) *budget.Policy {
	GinkgoHelper()
	keys := fmt.Sprintf("- {name: ops, user: olga, team: research, key_sha256: \"%064x\"}\n", 99)
	for i, k := range [][3]string{{"team-a", "ci", "research"}, {"team-a", "web", "support"}, {"team-b", "ci", "research"}, {"team-b", "web", "support"}} {
		keys += fmt.Sprintf("- {name: %s_%s, user: %s/%s-bot, team: %s/%s, tenant: %s, key_sha256: \"%064x\"}\n",
			k[0], k[1], k[0], k[1], k[0], k[2], k[0], i+1)
	}
	c, err := config.Parse([]byte(`
upstreams: [{name: default, url: "http://127.0.0.1:1"}]
api_keys:
` + keys + `rate_limiting:
  budget_division: {replicas: 1}
` + rateLimiting))
	Expect(err).NotTo(HaveOccurred())
	return budget.NewPolicy(c)
}

var _ = Describe("Tenancy", func() {
	// Each attack is a tenant's rule; every entry checks that the other tenant (and the
	// platform's own key) still admit what they admitted without it.
	DescribeTable("a tenant's rule binds only its own subtree",
		func(rule string, attacker string, victims ...string) {
			r := newRig(tenancyPolicy("  rules:\n  - " + rule + "\n"))
			Expect(r.admitted(attacker, "gpt-4o", 5, 0)).To(BeFalse(), "the rule binds its own tenant's key")
			for _, v := range victims {
				Expect(r.admitted(v, "gpt-4o", 1000, 1000)).To(BeTrue(), "%s is not in the tenant's subtree", v)
			}
		},
		Entry("a tenant's global rule of 1 token", `{name: team-a/starve, tenant: team-a, dimension: global, windows: [{limit: 1, rolling: {period: minute}}]}`,
			"team-a_ci", "team-b_ci", "team-b_web", "ops"),
		Entry("a tenant's per-model rule", `{name: team-a/model, tenant: team-a, dimension: model, windows: [{limit: 1, rolling: {period: minute}}]}`,
			"team-a_ci", "team-b_ci", "ops"),
		Entry("a tenant's per-team rule naming another tenant's team, unqualified and qualified",
			`{name: team-a/steal, tenant: team-a, dimension: team, subjects: [research, team-b/research, team-a/research], windows: [{limit: 1, rolling: {period: minute}}]}`,
			"team-a_ci", "team-b_ci", "ops"),
		Entry("a tenant's per-user rule", `{name: team-a/users, tenant: team-a, dimension: user, windows: [{limit: 1, rolling: {period: minute}}]}`,
			"team-a_web", "team-b_web", "ops"),
		Entry("a tenant's per-key rule naming another tenant's key",
			`{name: team-a/keys, tenant: team-a, dimension: api_key, subjects: [team-b_ci, team-a_ci], windows: [{limit: 1, rolling: {period: minute}}]}`,
			"team-a_ci", "team-b_ci", "ops"),
	)

	It("keeps one tenant's teams apart from another's of the same name", func() {
		r := newRig(tenancyPolicy(`
  limits:
    per_team: {tokens_per_minute: 1000}
`))
		Expect(r.admitted("team-a_ci", "", 1000, 0)).To(BeTrue())
		Expect(r.admitted("team-a_ci", "", 1, 0)).To(BeFalse(), "team-a/research spent its 1,000")
		Expect(r.admitted("team-b_ci", "", 1000, 0)).To(BeTrue(), "team-b/research is another team")
		Expect(r.admitted("ops", "", 1000, 0)).To(BeTrue(), "the platform's research is a third")
	})

	It("counts a tenant's teams in the tenant's own cap", func() {
		r := newRig(tenancyPolicy(`
  rules:
  - {name: team-a/cap, tenant: team-a, dimension: global, windows: [{limit: 1000, rolling: {period: minute}}]}
`))
		Expect(r.admitted("team-a_ci", "", 600, 0)).To(BeTrue())
		Expect(r.admitted("team-a_web", "", 600, 0)).To(BeFalse(), "another team of team-a draws on the same cap")
		Expect(r.admitted("team-a_web", "", 400, 0)).To(BeTrue())
	})

	It("caps each tenant as a whole with the platform's tenant dimension, and never the platform's keys", func() {
		r := newRig(tenancyPolicy(`
  rules:
  - {name: llm/each-tenant, dimension: tenant, windows: [{limit: 1000, rolling: {period: minute}}]}
`))
		Expect(r.admitted("team-a_ci", "", 600, 0)).To(BeTrue())
		dec := r.admit("team-a_web", "", 600, 0)
		Expect(dec.Refusal).NotTo(BeNil(), "both of team-a's teams count in its 1,000")
		Expect(dec.Refusal.Rule).To(Equal("llm/each-tenant"))
		Expect(dec.Refusal.Dimension).To(Equal(budget.Tenant))
		Expect(r.admitted("team-b_ci", "", 1000, 0)).To(BeTrue(), "team-b has its own 1,000")
		Expect(r.admitted("ops", "", 5000, 0)).To(BeTrue(), "the platform's key is in no tenant")
	})

	It("counts every tenant in a platform cap, whatever the tenants' own rules", func() {
		r := newRig(tenancyPolicy(`
  limits:
    global: {tokens_per_minute: 1000}
  rules:
  - {name: team-a/big, tenant: team-a, dimension: global, windows: [{limit: 1000000, rolling: {period: minute}}]}
`))
		Expect(r.admitted("team-a_ci", "", 600, 0)).To(BeTrue())
		dec := r.admit("team-b_ci", "", 600, 0)
		Expect(dec.Refusal).NotTo(BeNil(), "the platform's 1,000 counts every tenant")
		Expect(dec.Refusal.Dimension).To(Equal(budget.Global))
		Expect(dec.Refusal.Rule).To(BeEmpty(), "refused by the platform's limits")
	})

	It("never lets a tenant's named-subject rule replace the platform's budget", func() {
		r := newRig(tenancyPolicy(`
  limits:
    per_team: {tokens_per_minute: 500}
    per_api_key: {tokens_per_minute: 800}
  rules:
  - {name: team-a/research, tenant: team-a, dimension: team, subjects: [team-a/research], windows: [{limit: 6000, rolling: {period: minute}}]}
  - {name: team-a/ci, tenant: team-a, dimension: api_key, subjects: [team-a_ci], windows: [{limit: 6000, rolling: {period: minute}}]}
`))
		dec := r.admit("team-a_ci", "", 501, 0)
		Expect(dec.Refusal).NotTo(BeNil(), "the platform's 500 a team still holds team-a/research")
		Expect(dec.Refusal.Dimension).To(Equal(budget.Team))
		Expect(dec.Refusal.Rule).To(BeEmpty())
		Expect(r.admitted("team-a_ci", "", 500, 0)).To(BeTrue())
	})

	It("replaces a tenant's each-subject rule with its own named one, for its subjects only", func() {
		r := newRig(tenancyPolicy(`
  rules:
  - {name: team-a/teams, tenant: team-a, dimension: team, windows: [{limit: 100, rolling: {period: minute}}]}
  - {name: team-a/research, tenant: team-a, dimension: team, subjects: [team-a/research], windows: [{limit: 6000, rolling: {period: minute}}]}
`))
		Expect(r.admitted("team-a_ci", "", 3000, 0)).To(BeTrue(), "research's 6,000 replaces team-a's 100 a team")
		Expect(r.admitted("team-a_web", "", 101, 0)).To(BeFalse(), "support keeps team-a's 100")
	})

	It("reserves the platform's buckets first and takes nothing from them when the tenant's refuse", func() {
		r := newRig(tenancyPolicy(`
  limits:
    global: {tokens_per_minute: 1000}
  rules:
  - {name: team-a/cap, tenant: team-a, dimension: global, windows: [{limit: 100, rolling: {period: minute}}]}
`))
		dec := r.admit("team-a_ci", "", 200, 0)
		Expect(dec.Refusal).NotTo(BeNil())
		Expect(dec.Refusal.Rule).To(Equal("team-a/cap"), "the tenant's cap refused")
		Expect(r.admitted("team-b_ci", "", 1000, 0)).To(BeTrue(), "the platform's 1,000 is whole")

		dec = r.admit("team-a_ci", "", 2000, 0)
		Expect(dec.Refusal).NotTo(BeNil())
		Expect(dec.Refusal.Dimension).To(Equal(budget.Global))
		Expect(dec.Refusal.Rule).To(BeEmpty(), "refused by both, the platform's is named")
	})

	It("lists each tenant's rule with its tenant in the effective rules", func() {
		p := tenancyPolicy(`
  rules:
  - {name: team-a/cap, tenant: team-a, dimension: global, windows: [{limit: 100, rolling: {period: minute}}]}
`)
		Expect(p.EffectiveRules()).To(ConsistOf(HaveField("Tenant", "team-a")))
	})
})
