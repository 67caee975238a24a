// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package redisstore_test

import (
	"context"
	"fmt"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/proxy/budget/redisstore"
	"github.com/tokenwarden/tokenwarden/proxy/config"
	"github.com/tokenwarden/tokenwarden/test/redisserver"
)

// tenantPolicy is a fleet on url with two keys of tenant team-a (ci, whose own budget
// is 500 tokens a day, and web), one of team-b and the platform's ops, as the operator
// renders them, and the rate limiting given.
func tenantPolicy(url, rateLimiting string) *budget.Policy {
	GinkgoHelper()
	c, err := config.Parse([]byte(fmt.Sprintf(`
upstreams: [{name: default, url: "http://127.0.0.1:1"}]
api_keys:
- {name: ops, team: research, key_sha256: "%064x"}
- {name: team-a_ci, team: team-a/research, tenant: team-a, rate_limit_tokens_per_day: 500, key_sha256: "%064x"}
- {name: team-a_web, team: team-a/support, tenant: team-a, key_sha256: "%064x"}
- {name: team-b_ci, team: team-b/research, tenant: team-b, key_sha256: "%064x"}
rate_limiting:
  storage: redis
  redis: {url: "%s"}
`, 1, 2, 3, 4, url) + rateLimiting))
	Expect(err).NotTo(HaveOccurred())
	return budget.NewPolicy(c)
}

var _ = Describe("Tenant levels on a Redis Cluster", func() {
	ctx := context.Background()
	keyOf := func(prefix string) *redisstore.Store {
		s, err := redisstore.New(redisstore.Options{URL: cluster.URL(), Prefix: prefix})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(s.Close)
		return s
	}

	It("keeps the platform's keys under the names and slots they had before tenants had levels", func() {
		s := keyOf("pin")
		for _, c := range []struct {
			key  budget.Key
			name string
			slot int
		}{
			{budget.Key{Kind: budget.TokensMinute, Dim: budget.Global}, "{pin:764}:global:", 6268},
			{budget.Key{Kind: budget.TokensDay, Dim: budget.APIKey, ID: "alice"}, "{pin:945}:api_key:alice", 13630},
			{budget.Key{Kind: budget.TokensMinute, Dim: budget.Team, ID: "team-a/research"}, "{pin:599}:team:team-a/research", 14223},
			{budget.Key{Kind: budget.TokensMinute, Dim: budget.Model, ID: "gpt-4o"}, "{pin:557}:model:gpt-4o", 4908},
			{budget.Key{Kind: budget.Rolling, Dim: budget.Tenant, ID: "team-a", Rule: "llm/each-tenant"},
				"{pin:734}:rule:llm/each-tenant:0:tenant:6:team-a:", 10121},
			{budget.Key{Kind: budget.Calendar, Dim: budget.Global, Rule: "llm/month", Start: 1764547200},
				"{pin:764}:rule:llm/month:0:global:0::@1764547200", 6268},
		} {
			Expect(s.Key(c.key)).To(Equal(c.name), "%+v", c.key)
			Expect(redisserver.Slot(s.Key(c.key))).To(Equal(c.slot), "%+v", c.key)
		}
	})

	It("gives each tenant's subjects slot groups of their own, apart from the platform's and from each other's", func() {
		s := keyOf("pin")
		slotOf := func(tenant string, dim budget.Dimension, id, rule string) int {
			return redisserver.Slot(s.Key(budget.Key{Kind: budget.Rolling, Dim: dim, ID: id, Tenant: tenant, Rule: rule}))
		}
		platformGlobal := redisserver.Slot(s.Key(budget.Key{Kind: budget.TokensMinute, Dim: budget.Global}))
		Expect(slotOf("team-a", budget.Global, "", "team-a/cap")).NotTo(Equal(platformGlobal), "a tenant's global is not the platform's")
		Expect(slotOf("team-a", budget.Global, "", "team-a/cap")).NotTo(Equal(slotOf("team-b", budget.Global, "", "team-b/cap")), "nor another tenant's")
		platformModel := redisserver.Slot(s.Key(budget.Key{Kind: budget.TokensMinute, Dim: budget.Model, ID: "gpt-4o"}))
		Expect(slotOf("team-a", budget.Model, "gpt-4o", "team-a/model")).NotTo(Equal(platformModel), "a tenant's model budget is not the platform's")
		Expect(slotOf("team-a", budget.APIKey, "team-a_ci", "team-a/keys")).To(Equal(slotOf("team-a", budget.APIKey, "team-a_ci", "team-a/other")),
			"one subject of a tenant, one slot: every rule of it is one call")
	})

	Describe("a reservation under the platform's and a tenant's budgets", func() {
		var (
			s *redisstore.Store
			l *budget.Limiter
			p *budget.Policy
		)
		// The platform holds a day's 100,000 tokens for the fleet and 500 for ci;
		// team-a caps itself at 800 a day.
		capKey := budget.Key{Kind: budget.Rolling, Dim: budget.Global, Tenant: "team-a", Rule: "team-a/cap"}
		globalKey := budget.Key{Kind: budget.TokensDay, Dim: budget.Global}
		ciKey := budget.Key{Kind: budget.TokensDay, Dim: budget.APIKey, ID: "team-a_ci"}
		level := func(k budget.Key, full float64) float64 {
			GinkgoHelper()
			v, ok, err := s.Level(ctx, k)
			Expect(err).NotTo(HaveOccurred())
			if !ok {
				return full // an absent bucket is a full one
			}
			return v
		}
		BeforeEach(func() {
			s = clusterStore(cluster.URL(), nil)
			l = budget.NewLimiter(s, budget.NopRecorder{}, budget.SystemClock{}, false)
			p = tenantPolicy(cluster.URL(), `
  limits:
    global: {tokens_per_day: 100000}
  rules:
  - {name: team-a/cap, tenant: team-a, dimension: global, windows: [{limit: 800, rolling: {period: day}}]}
`)
		})
		admitOn := func(key string, tokens int64) budget.Decision {
			GinkgoHelper()
			dec, err := l.Admit(ctx, p, budget.Identity{Key: p.Key(key)}, budget.Ask{Input: tokens})
			Expect(err).NotTo(HaveOccurred())
			return dec
		}

		It("decides the platform's first: a request the platform refuses never holds the tenant's cap, not even until its release", func() {
			var neighbour *budget.Decision
			s.BeforeRelease(func() {
				defer GinkgoRecover()
				if neighbour == nil {
					// While ci's refusal is released, web of the same tenant asks for the
					// tenant's whole 800.
					dec := admitOn("team-a_web", 800)
					neighbour = &dec
				}
			})
			dec := admitOn("team-a_ci", 600)
			Expect(dec.Refusal).NotTo(BeNil(), "ci's 500 a day refuses 600")
			Expect(dec.Refusal.Dimension).To(Equal(budget.APIKey))
			Expect(dec.Refusal.Rule).To(BeEmpty(), "refused by the platform's limits")
			Expect(neighbour).NotTo(BeNil(), "the platform's global bucket, taken first, was released")
			Expect(neighbour.Refusal).To(BeNil(), "the neighbour found the tenant's cap whole")
			Expect(level(capKey, 800)).To(BeNumerically("~", 0, 0.5), "the cap holds the neighbour's 800 and nothing of ci's")
		})

		It("releases the platform's budgets when the tenant's refuses, and names the platform's when both refuse", func() {
			Expect(admitOn("team-a_web", 500).Refusal).To(BeNil())
			Expect(admitOn("team-b_ci", 5000).Refusal).To(BeNil(), "team-b is not under team-a's cap")
			Expect(admitOn("team-a_ci", 250).Refusal).To(BeNil(), "the cap has 50 left, ci 250")
			before := level(globalKey, 1e5)

			dec := admitOn("team-a_ci", 100)
			Expect(dec.Refusal).NotTo(BeNil())
			Expect(dec.Refusal.Rule).To(Equal("team-a/cap"), "the tenant's cap refused")
			Expect(level(globalKey, 1e5)).To(BeNumerically("~", before, 5), "the platform's global bucket got its 100 back")
			Expect(level(ciKey, 500)).To(BeNumerically("~", 250, 0.5), "and ci's own bucket")

			dec = admitOn("team-a_ci", 300)
			Expect(dec.Refusal).NotTo(BeNil())
			Expect(dec.Refusal.Dimension).To(Equal(budget.APIKey), "refused by both, the platform's is named")
			Expect(dec.Refusal.Rule).To(BeEmpty())
			Expect(admitOn("team-a_ci", 50).Refusal).To(BeNil(), "the cap and ci hold what they held")
		})
	})
})
