// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package controllers_test

import (
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	. "github.com/onsi/gomega/gstruct"
	"github.com/onsi/gomega/types"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	twv1alpha1 "github.com/tokenwarden/tokenwarden/api/v1alpha1"
	"github.com/tokenwarden/tokenwarden/proxy/config"
)

// tenants is a fleet in namespace home that accepts every namespace, and two tenant
// namespaces a and b, each with a key of team research.
type tenants struct{ home, a, b string }

func newTenants() tenants {
	GinkgoHelper()
	t := tenants{home: newNamespace("platform"), a: newNamespace("tenant-a"), b: newNamespace("tenant-b")}
	Expect(k8sClient.Create(ctx, credentialSecret(t.home, "provider", map[string]string{"anthropic": "upstream"}))).To(Succeed())
	tp := fleetProxy(t.home, 1)
	tp.Spec.AllowedNamespaces = twv1alpha1.AllowedNamespaces{From: twv1alpha1.NamespacesFromAll}
	Expect(k8sClient.Create(ctx, tp)).To(Succeed())
	for _, ns := range []string{t.home, t.a, t.b} {
		Expect(k8sClient.Create(ctx, keySecret(ns, "ci", "sk-ci-"+ns))).To(Succeed())
		k := apiKey(ns, "ci", "ci", "bot", "research")
		k.Spec.ProxyRef.Namespace = t.home
		Expect(k8sClient.Create(ctx, k)).To(Succeed())
	}
	return t
}

// budget creates a budget of fleet t.home in namespace ns, shaped by set.
func (t tenants) budget(ns, name string, dim twv1alpha1.Dimension, set func(*twv1alpha1.TokenBudgetSpec)) {
	GinkgoHelper()
	b := tokenBudget(ns, name, dim, "", 0, 0)
	b.Spec.ProxyRef.Namespace = t.home
	set(&b.Spec)
	Expect(k8sClient.Create(ctx, b)).To(Succeed())
}

// setTenancy writes the fleet's spec.tenancy ("" unsets it).
func (t tenants) setTenancy(tenancy twv1alpha1.Tenancy) {
	GinkgoHelper()
	var tp twv1alpha1.TokenProxy
	Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: t.home, Name: "fleet"}, &tp)).To(Succeed())
	patch := client.MergeFrom(tp.DeepCopy())
	tp.Spec.Tenancy = tenancy
	Expect(k8sClient.Patch(ctx, &tp, patch)).To(Succeed())
}

func perMinute(n int64) func(*twv1alpha1.TokenBudgetSpec) {
	return func(s *twv1alpha1.TokenBudgetSpec) { s.TokensPerMinute = n }
}

func ruleNamed(c *config.Config, name string) *config.Rule {
	for i := range c.RateLimiting.Rules {
		if c.RateLimiting.Rules[i].Name == name {
			return &c.RateLimiting.Rules[i]
		}
	}
	return nil
}

func keyNamed(c *config.Config, name string) *config.APIKey {
	for i := range c.APIKeys {
		if c.APIKeys[i].Name == name {
			return &c.APIKeys[i]
		}
	}
	return nil
}

var inForceBudget = verdict{metav1.ConditionTrue, twv1alpha1.ReasonAccepted, "The budget is in force"}

var _ = Describe("Tenancy", func() {
	It("gives a new fleet Namespaces: each tenant's budgets bind its own keys, its teams are its own, its conflicts its own", func() {
		t := newTenants()
		// A tenant's Global of one token, created before the platform's: under Flat it
		// would bind the whole fleet.
		t.budget(t.a, "starve", twv1alpha1.DimensionGlobal, perMinute(1))
		t.budget(t.home, "fleet-cap", twv1alpha1.DimensionGlobal, perMinute(1_000_000))
		t.budget(t.a, "steal", twv1alpha1.DimensionPerTeam, func(s *twv1alpha1.TokenBudgetSpec) {
			s.Subjects = []string{"research", t.b + "/research"}
			s.Windows = windows(rollingWindow("1", twv1alpha1.PeriodMinute, 0))
		})
		t.budget(t.a, "keys", twv1alpha1.DimensionPerAPIKey, func(s *twv1alpha1.TokenBudgetSpec) {
			s.Subjects = []string{"ci"}
			s.Windows = windows(rollingWindow("10", twv1alpha1.PeriodMinute, 0))
		})
		t.budget(t.b, "starve", twv1alpha1.DimensionGlobal, perMinute(5))

		Eventually(func(g Gomega) {
			st := proxyStatus(g, t.home)
			g.Expect(st.Tenancy).To(Equal(twv1alpha1.TenancyNamespaces))
			g.Expect(verdictOf(st.Conditions, twv1alpha1.ConditionTenantIsolation)).To(Equal(verdict{metav1.ConditionTrue,
				twv1alpha1.ReasonTenancyNamespaces, "Tenancy Namespaces (spec.tenancy is unset and the fleet was created with tenancy): " +
					"the TokenBudgets of each accepted namespace other than " + t.home + " apply only to its own keys, " +
					"and its keys' teams and users are qualified by it"}))
			for _, b := range []struct{ ns, name string }{{t.a, "starve"}, {t.home, "fleet-cap"}, {t.a, "steal"}, {t.a, "keys"}, {t.b, "starve"}} {
				g.Expect(acceptedOf(budgetStatus(g, b.ns, b.name).Conditions)).To(Equal(inForceBudget), "%s/%s: no conflict across levels", b.ns, b.name)
			}
			c := rendered(g, t.home)
			g.Expect(c.RateLimiting.Limits.Global.TokensPerMinute).To(Equal(int64(1_000_000)), "only the platform's budget is in limits")
			g.Expect(ruleNamed(c, t.a+"/starve")).To(PointTo(MatchFields(IgnoreExtras, Fields{
				"Tenant": Equal(t.a), "Dimension": Equal(config.RuleGlobal),
			})))
			g.Expect(ruleNamed(c, t.b+"/starve")).To(PointTo(HaveField("Tenant", t.b)))
			g.Expect(ruleNamed(c, t.a+"/steal")).To(PointTo(MatchFields(IgnoreExtras, Fields{
				"Tenant": Equal(t.a), "Subjects": Equal([]string{t.a + "/research", t.a + "/" + t.b + "/research"}),
			})), "a tenant names only its own teams")
			g.Expect(ruleNamed(c, t.a+"/keys")).To(PointTo(HaveField("Subjects", []string{t.a + "_ci"})), "a tenant's key ci is its own")
			g.Expect(keyNamed(c, "ci")).To(PointTo(MatchFields(IgnoreExtras, Fields{"Team": Equal("research"), "Tenant": BeEmpty()})))
			g.Expect(keyNamed(c, t.a+"_ci")).To(PointTo(MatchFields(IgnoreExtras, Fields{
				"Team": Equal(t.a + "/research"), "User": Equal(t.a + "/bot"), "Tenant": Equal(t.a),
			})))
			g.Expect(keyNamed(c, t.b+"_ci")).To(PointTo(HaveField("Team", t.b+"/research")))
			g.Expect(budgetStatus(g, t.a, "starve").Summary.Subjects).To(Equal("tenant " + t.a))
		}).Should(Succeed())

		By("two budgets of one tenant still conflict, within it")
		t.budget(t.a, "starve-again", twv1alpha1.DimensionGlobal, perMinute(2))
		Eventually(func(g Gomega) {
			g.Expect(acceptedOf(budgetStatus(g, t.a, "starve-again").Conditions)).To(Equal(verdict{metav1.ConditionFalse,
				twv1alpha1.ReasonConflicted, "TokenBudget " + t.a + "/starve is older and sets the same budget: every key of " + t.a + ", tokens per minute"}))
		}).Should(Succeed())

		By("a tenant may not count by tenant")
		t.budget(t.a, "each-tenant", twv1alpha1.DimensionPerTenant, func(s *twv1alpha1.TokenBudgetSpec) {
			s.Windows = windows(rollingWindow("10", twv1alpha1.PeriodMinute, 0))
		})
		t.budget(t.home, "each-tenant", twv1alpha1.DimensionPerTenant, func(s *twv1alpha1.TokenBudgetSpec) {
			s.Windows = windows(rollingWindow("2M", twv1alpha1.PeriodMinute, 0))
		})
		Eventually(func(g Gomega) {
			g.Expect(acceptedOf(budgetStatus(g, t.a, "each-tenant").Conditions)).To(Equal(verdict{metav1.ConditionFalse,
				twv1alpha1.ReasonInvalidBudget, "A budget in tenant namespace " + t.a + " counts only that tenant's keys, so it cannot count by tenant or select on it: " +
					"PerTenant, countBy Tenant and appliesWhen Tenant belong in the fleet's namespace " + t.home}))
			g.Expect(acceptedOf(budgetStatus(g, t.home, "each-tenant").Conditions)).To(Equal(inForceBudget))
			g.Expect(ruleNamed(rendered(g, t.home), t.home+"/each-tenant")).To(PointTo(MatchFields(IgnoreExtras, Fields{
				"Tenant": BeEmpty(), "Dimension": Equal(config.RuleTenant),
			})))
		}).Should(Succeed())
	})

	It("keeps Flat for a fleet an earlier operator reconciled, and moves both ways when the platform sets spec.tenancy", func() {
		t := newTenants()
		// Named to win a conflict of budgets created in the same second.
		t.budget(t.a, "cap", twv1alpha1.DimensionGlobal, perMinute(1))
		t.budget(t.home, "fleet-cap", twv1alpha1.DimensionGlobal, perMinute(1_000_000))
		Eventually(func(g Gomega) {
			g.Expect(proxyStatus(g, t.home).Tenancy).To(Equal(twv1alpha1.TenancyNamespaces))
		}).Should(Succeed())

		By("the fleet as an operator without tenancy left it: a status, and no tenancy in it")
		Eventually(func(g Gomega) {
			var tp twv1alpha1.TokenProxy
			g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: t.home, Name: "fleet"}, &tp)).To(Succeed())
			g.Expect(tp.Status.ObservedGeneration).To(BeNumerically(">", 0))
			tp.Status.Tenancy = ""
			g.Expect(k8sClient.Status().Update(ctx, &tp)).To(Succeed())
		}).Should(Succeed())
		flat := func() {
			GinkgoHelper()
			Eventually(func(g Gomega) {
				st := proxyStatus(g, t.home)
				g.Expect(st.Tenancy).To(Equal(twv1alpha1.TenancyFlat))
				g.Expect(condition(st.Conditions, twv1alpha1.ConditionTenantIsolation)).To(MatchFields(IgnoreExtras, Fields{
					"Status": Equal(metav1.ConditionFalse), "Reason": Equal(twv1alpha1.ReasonTenancyFlat),
				}))
				g.Expect(acceptedOf(budgetStatus(g, t.home, "fleet-cap").Conditions)).To(MatchFields(IgnoreExtras, Fields{
					"Reason": Equal(twv1alpha1.ReasonConflicted),
				}), "under Flat the tenant's older Global wins, as before tenancy")
				c := rendered(g, t.home)
				g.Expect(c.RateLimiting.Limits.Global.TokensPerMinute).To(Equal(int64(1)))
				g.Expect(c.RateLimiting.Rules).To(BeEmpty())
				g.Expect(keyNamed(c, t.a+"_ci")).To(PointTo(HaveField("Team", "research")), "teams shared by name")
			}).Should(Succeed())
		}
		flat()
		Eventually(func(g Gomega) {
			g.Expect(condition(proxyStatus(g, t.home).Conditions, twv1alpha1.ConditionTenantIsolation).Message).To(Equal(
				"Tenancy Flat (spec.tenancy is unset and the fleet was created before tenancy existed): every accepted TokenBudget applies to the whole fleet, " +
					"and teams and users are shared by name across namespaces; set spec.tenancy: Namespaces to confine each namespace's budgets to its own keys"))
		}).Should(Succeed())

		By("the platform opts in")
		t.setTenancy(twv1alpha1.TenancyNamespaces)
		Eventually(func(g Gomega) {
			g.Expect(proxyStatus(g, t.home).Tenancy).To(Equal(twv1alpha1.TenancyNamespaces))
			g.Expect(acceptedOf(budgetStatus(g, t.home, "fleet-cap").Conditions)).To(Equal(inForceBudget))
			c := rendered(g, t.home)
			g.Expect(c.RateLimiting.Limits.Global.TokensPerMinute).To(Equal(int64(1_000_000)))
			g.Expect(ruleNamed(c, t.a+"/cap")).To(PointTo(HaveField("Tenant", t.a)))
			g.Expect(keyNamed(c, t.a+"_ci")).To(PointTo(HaveField("Team", t.a+"/research")))
		}).Should(Succeed())

		By("and back to Flat")
		t.setTenancy(twv1alpha1.TenancyFlat)
		flat()

		By("unsetting spec.tenancy keeps the tenancy in force")
		t.setTenancy("")
		Consistently(func(g Gomega) {
			g.Expect(proxyStatus(g, t.home).Tenancy).To(Equal(twv1alpha1.TenancyFlat))
		}, "2s").Should(Succeed())
	})

	It("lets a tenant's key tighten the platform's per-key budget, never loosen it, and under Flat keeps a key's own limits as written", func() {
		t := newTenants()
		t.budget(t.home, "each-key", twv1alpha1.DimensionPerAPIKey, func(s *twv1alpha1.TokenBudgetSpec) {
			s.TokensPerMinute, s.RequestsPerSecond = 1000, 10
		})
		setLimits := func(ns string, tpm, tpd, rps int64) {
			GinkgoHelper()
			var k twv1alpha1.ApiKey
			Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: "ci"}, &k)).To(Succeed())
			patch := client.MergeFrom(k.DeepCopy())
			k.Spec.TokensPerMinute, k.Spec.TokensPerDay, k.Spec.RequestsPerSecond = tpm, tpd, rps
			Expect(k8sClient.Patch(ctx, &k, patch)).To(Succeed())
		}
		setLimits(t.home, 1_000_000, 0, 100) // the platform's own key may have more
		setLimits(t.a, 1_000_000, 50, 100)   // a tenant's key asks for more, and a day the platform does not set
		setLimits(t.b, 500, 0, 5)            // a tenant's key asks for less
		limits := func(tpm, tpd, rps int64) types.GomegaMatcher {
			return PointTo(MatchFields(IgnoreExtras, Fields{
				"RateLimitTokensPerMinute": Equal(tpm), "RateLimitTokensPerDay": Equal(tpd), "RateLimit": Equal(rps),
			}))
		}
		Eventually(func(g Gomega) {
			c := rendered(g, t.home)
			g.Expect(c.RateLimiting.Limits.PerAPIKey.TokensPerMinute).To(Equal(int64(1000)))
			g.Expect(keyNamed(c, "ci")).To(limits(1_000_000, 0, 100), "the platform's key as written")
			g.Expect(keyNamed(c, t.a+"_ci")).To(limits(0, 50, 0), "tenant a's key keeps the platform's 1,000 a minute and 10 a second, and its own day")
			g.Expect(keyNamed(c, t.b+"_ci")).To(limits(500, 0, 5), "tenant b's key tightens both")
		}).Should(Succeed())

		By("under Flat, a key's own limits replace the fleet's as before tenancy")
		t.setTenancy(twv1alpha1.TenancyFlat)
		Eventually(func(g Gomega) {
			g.Expect(keyNamed(rendered(g, t.home), t.a+"_ci")).To(limits(1_000_000, 50, 100))
		}).Should(Succeed())
	})

	It("bounds the scheduling weight of a tenant's key by the fleet's allowance, and says so in the key's status", func() {
		t := newTenants()
		setWeight := func(ns string, w int32) {
			GinkgoHelper()
			var k twv1alpha1.ApiKey
			Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: "ci"}, &k)).To(Succeed())
			patch := client.MergeFrom(k.DeepCopy())
			k.Spec.Weight = w
			Expect(k8sClient.Patch(ctx, &k, patch)).To(Succeed())
		}
		setWeight(t.home, 50)
		setWeight(t.a, 50)
		inForce := verdict{metav1.ConditionTrue, twv1alpha1.ReasonAccepted, "The key is in force"}
		Eventually(func(g Gomega) {
			g.Expect(acceptedOf(keyStatus(g, t.home, "ci").Conditions)).To(Equal(inForce), "the platform's own key sets any weight")
			g.Expect(acceptedOf(keyStatus(g, t.a, "ci").Conditions)).To(Equal(verdict{metav1.ConditionFalse, twv1alpha1.ReasonWeightNotAllowed,
				"The key sets weight 50, and TokenProxy " + t.home + "/fleet allows the keys of other namespaces at most 1 " +
					"(spec.maxTenantKeyWeight is unset, which under tenancy Namespaces allows tenants' keys weight 1)"}))
			c := rendered(g, t.home)
			g.Expect(keyNamed(c, "ci")).To(PointTo(HaveField("Weight", 50.0)))
			g.Expect(keyNamed(c, t.a+"_ci")).To(BeNil(), "a tenant's key above the allowance is not rendered")
			g.Expect(keyNamed(c, t.b+"_ci")).NotTo(BeNil(), "the other tenant's key is unchanged")
		}).Should(Succeed())

		By("the platform allows tenants' keys a weight up to 10")
		var tp twv1alpha1.TokenProxy
		Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: t.home, Name: "fleet"}, &tp)).To(Succeed())
		patch := client.MergeFrom(tp.DeepCopy())
		tp.Spec.MaxTenantKeyWeight = ptr.To[int32](10)
		Expect(k8sClient.Patch(ctx, &tp, patch)).To(Succeed())
		Eventually(func(g Gomega) {
			g.Expect(acceptedOf(keyStatus(g, t.a, "ci").Conditions)).To(Equal(verdict{metav1.ConditionFalse, twv1alpha1.ReasonWeightNotAllowed,
				"The key sets weight 50, and TokenProxy " + t.home + "/fleet allows the keys of other namespaces at most 10 (spec.maxTenantKeyWeight: 10)"}))
		}).Should(Succeed())
		setWeight(t.a, 10)
		Eventually(func(g Gomega) {
			g.Expect(acceptedOf(keyStatus(g, t.a, "ci").Conditions)).To(Equal(inForce))
			g.Expect(keyNamed(rendered(g, t.home), t.a+"_ci")).To(PointTo(HaveField("Weight", 10.0)))
		}).Should(Succeed())
	})
})
