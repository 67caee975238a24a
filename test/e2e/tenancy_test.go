// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"context"
	"fmt"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/tokenwarden/tokenwarden/test/fakellm"
	"github.com/tokenwarden/tokenwarden/test/stack"
)

// shared is a fleet of one proxy in namespace home that accepts every namespace, with
// the platform's key ops (team research) and two tenant namespaces a and b, each with a
// key of team research: a-ci and b-ci.
type shared struct {
	home, a, b string
	p          *stack.Proxy
}

// tenantKey is an ApiKey NAME of the fleet in namespace home, in the namespace it is
// applied to, with its labelled Secret holding sk-e2e-NAME; spec adds to its spec.
func tenantKey(home, name, spec string) string {
	return fmt.Sprintf(`---
apiVersion: v1
kind: Secret
metadata: {name: %[1]s-key, labels: {tokenwarden.io/secret: api-key}}
stringData: {key: sk-e2e-%[1]s}
---
apiVersion: tokenwarden.io/v1alpha1
kind: ApiKey
metadata: {name: %[1]s}
spec: {proxyRef: {name: fleet, namespace: %[2]s}, secretRef: {name: %[1]s-key}, user: bot, team: research%[3]s}
`, name, home, spec)
}

// tenantBudget is a TokenBudget of the fleet in namespace home; spec is its spec
// without the proxyRef.
func tenantBudget(home, name, spec string) string {
	return fmt.Sprintf(`---
apiVersion: tokenwarden.io/v1alpha1
kind: TokenBudget
metadata: {name: %s}
spec: {proxyRef: {name: fleet, namespace: %s}, %s}
`, name, home, spec)
}

// newShared starts the fleet; tenancy is its spec.tenancy ("" leaves it unset) and
// platform holds the platform's own budgets (manifests for namespace home).
func newShared(tenancy string, platform ...string) *shared {
	GinkgoHelper()
	s := &shared{home: namespace(), a: namespace(), b: namespace()}
	spec := ""
	if tenancy != "" {
		spec = "\n  tenancy: " + tenancy
	}
	apply(s.home, fmt.Sprintf(`
apiVersion: tokenwarden.io/v1alpha1
kind: TokenProxy
metadata: {name: fleet}
spec:
  replicas: 1
  upstreams: [{name: fake, url: %q}]
  allowedNamespaces: {from: All}%s
`, st.LLMURL, spec)+tenantKey(s.home, "ops", ""))
	for _, m := range platform {
		apply(s.home, m)
	}
	apply(s.a, tenantKey(s.home, "a-ci", ""))
	apply(s.b, tenantKey(s.home, "b-ci", ""))
	proxies, err := st.SyncProxies(context.Background(), s.home, "fleet")
	Expect(err).NotTo(HaveOccurred())
	enforced(s.home)
	s.p = proxies[0]
	// Each request reports 10 input and 10 output tokens.
	st.LLM.Set(fakellm.Behaviour{InputTokens: 10, OutputTokens: 10})
	return s
}

// in applies a manifest in a namespace and waits until the proxy enforces it.
func (s *shared) in(ns, manifest string) {
	GinkgoHelper()
	apply(ns, manifest)
	enforced(s.home)
}

// admits reports whether each key's request of max_tokens is admitted.
func (s *shared) admits(maxTokens int, keys ...string) map[string]int {
	GinkgoHelper()
	out := map[string]int{}
	for _, k := range keys {
		out[k] = chat(s.p, k, "gpt-4o", maxTokens).code
	}
	return out
}

var _ = Describe("Tenants of one fleet, with kubectl and a proxy process", func() {
	// Each row is what a tenant creates in its own namespace (a); its own key's request
	// shows the attack is in force, and the other tenant's and the platform's keys admit
	// what they admitted before it.
	DescribeTable("a tenant's attack leaves the other tenant's admissions unchanged",
		func(attack func(s *shared)) {
			s := newShared("")
			before := s.admits(100, "b-ci", "ops")
			Expect(before).To(Equal(map[string]int{"b-ci": 200, "ops": 200}))
			attack(s)
			Expect(chat(s.p, "a-ci", "gpt-4o", 100).code).To(Equal(429), "the attack binds the tenant's own key")
			Expect(s.admits(100, "b-ci", "ops")).To(Equal(before), "the other tenant and the platform are untouched")
		},
		Entry("a Global budget of 1 token", func(s *shared) {
			s.in(s.a, tenantBudget(s.home, "starve", "dimension: Global, tokensPerMinute: 1"))
		}),
		Entry("a PerModel budget of 1 token", func(s *shared) {
			s.in(s.a, tenantBudget(s.home, "model", "dimension: PerModel, model: gpt-4o, tokensPerMinute: 1"))
		}),
		Entry("a PerTeam budget naming the other tenant's team, plainly and qualified", func(s *shared) {
			s.in(s.a, tenantBudget(s.home, "steal", fmt.Sprintf(`dimension: PerTeam, subjects: [research, %s/research], windows: [{limit: "1", rolling: {period: Minute}}]`, s.b)))
		}),
		Entry("a PerAPIKey budget naming the other tenant's key", func(s *shared) {
			s.in(s.a, tenantBudget(s.home, "keys", fmt.Sprintf(`dimension: PerAPIKey, subjects: [a-ci, %s/b-ci], windows: [{limit: "1", rolling: {period: Minute}}]`, s.b)))
		}),
		Entry("a Global budget of 1 token created before the platform's of the same dimension", func(s *shared) {
			s.in(s.a, tenantBudget(s.home, "first", "dimension: Global, tokensPerMinute: 1"))
			s.in(s.home, tenantBudget(s.home, "fleet-cap", "dimension: Global, tokensPerMinute: 1000000"))
		}),
		Entry("an ApiKey declaring tokensPerMinute far above the platform's 500 a key", func(s *shared) {
			s.in(s.home, tenantBudget(s.home, "each-key", "dimension: PerAPIKey, tokensPerMinute: 500"))
			s.in(s.a, tenantKey(s.home, "a-ci", ", tokensPerMinute: 1000000"))
			// a-ci spends 450 of the platform's 500: its next request is beyond them.
			st.LLM.Set(fakellm.Behaviour{InputTokens: 10, OutputTokens: 440})
			Expect(chat(s.p, "a-ci", "gpt-4o", 450).code).To(Equal(200))
			st.LLM.Set(fakellm.Behaviour{InputTokens: 10, OutputTokens: 10})
		}),
		Entry("an ApiKey declaring tokensPerMinute below the platform's 500 a key is held to its own", func(s *shared) {
			s.in(s.home, tenantBudget(s.home, "each-key", "dimension: PerAPIKey, tokensPerMinute: 500"))
			s.in(s.a, tenantKey(s.home, "a-ci", ", tokensPerMinute: 50"))
		}),
	)

	It("keeps an ApiKey that claims another tenant's team or user off that team's budgets", func() {
		s := newShared("")
		s.in(s.b, tenantBudget(s.home, "research", `dimension: PerTeam, subjects: [research], windows: [{limit: "300", rolling: {period: Minute}}]`)+
			tenantBudget(s.home, "bot", `dimension: PerUser, subjects: [bot], windows: [{limit: "300", rolling: {period: Minute}}]`))
		// Each request spends 100 tokens. a-ci is of team research and user bot too, by name:
		// if those were tenant b's, its third request would not fit.
		st.LLM.Set(fakellm.Behaviour{InputTokens: 10, OutputTokens: 90})
		for i := range 3 {
			Expect(chat(s.p, "a-ci", "gpt-4o", 100).code).To(Equal(200), "request %d: tenant b's budgets are not a-ci's", i+1)
		}
		Expect(chat(s.p, "b-ci", "gpt-4o", 200).code).To(Equal(200), "tenant b's research still holds its 300")
		Expect(chat(s.p, "b-ci", "gpt-4o", 200).code).To(Equal(429), "and counts its own key")
	})

	It("serves a team-scoped cache answer to its own tenant's team only, never to another tenant's team of the same name", func() {
		s := newShared("")
		s.in(s.a, tenantKey(s.home, "a-bot", ""))
		_, err := st.Kubectl("patch", "-n", s.home, "tokenproxy", "fleet", "--type", "merge", "-p", `{"spec":{"cache":{"storage":"Memory","scope":"Team"}}}`)
		Expect(err).NotTo(HaveOccurred())
		enforced(s.home)
		// a-ci and a-bot are tenant a's team research, b-ci tenant b's, ops the platform's.
		cache := func(key string) string { return chat(s.p, key, "gpt-4o", 100).header.Get("X-Tokenwarden-Cache") }
		Expect(cache("a-ci")).To(Equal("miss"), "tenant a's request fills the cache")
		Eventually(func() string { return cache("a-bot") }).Should(Equal("hit"), "another key of tenant a's team is served its answer")
		before := len(st.LLM.Requests())
		Expect(cache("b-ci")).To(Equal("miss"), "the identical request of tenant b's team research is not served tenant a's answer")
		Expect(cache("ops")).To(Equal("miss"), "nor is the platform's team research")
		Expect(st.LLM.Requests()).To(HaveLen(before+2), "both went to the backend")
		Eventually(func() string { return cache("b-ci") }).Should(Equal("hit"), "tenant b is served its own answer")
	})

	It("composes downward: a platform cap counts every tenant, and a tenant's named budget never replaces the platform's", func() {
		s := newShared("", `
apiVersion: tokenwarden.io/v1alpha1
kind: TokenBudget
metadata: {name: fleet-cap}
spec: {proxyRef: {name: fleet}, dimension: Global, tokensPerMinute: 1000}
---
apiVersion: tokenwarden.io/v1alpha1
kind: TokenBudget
metadata: {name: each-team}
spec: {proxyRef: {name: fleet}, dimension: PerTeam, tokensPerMinute: 400}
`)
		s.in(s.a, tenantBudget(s.home, "research", `dimension: PerTeam, subjects: [research], windows: [{limit: "100k", rolling: {period: Minute}}]`))
		// Each request spends 300 tokens.
		st.LLM.Set(fakellm.Behaviour{InputTokens: 10, OutputTokens: 290})
		refused := chat(s.p, "a-ci", "gpt-4o", 450)
		Expect(refused.code).To(Equal(429), "the platform's 400 a team holds team-a/research, whatever tenant a names")
		Expect(refused.err.Details).To(HaveKeyWithValue("token_dimension", "team"))
		for _, k := range []string{"a-ci", "b-ci", "ops"} {
			Expect(chat(s.p, k, "gpt-4o", 300).code).To(Equal(200), k)
		}
		refused = chat(s.p, "ops", "gpt-4o", 300)
		Expect(refused.code).To(Equal(429))
		Expect(refused.err.Details).To(HaveKeyWithValue("token_dimension", "global"), "the platform's 1,000 counted both tenants and its own key")
	})

	It("moves both ways between Flat and Namespaces when the platform sets spec.tenancy", func() {
		fleet := func(tenancy string) string {
			return fmt.Sprintf(`
apiVersion: tokenwarden.io/v1alpha1
kind: TokenProxy
metadata: {name: fleet}
spec:
  replicas: 1
  upstreams: [{name: fake, url: %q}]
  allowedNamespaces: {from: All}
  tenancy: %s
`, st.LLMURL, tenancy)
		}
		s := newShared("Flat")
		s.in(s.a, tenantBudget(s.home, "starve", "dimension: Global, tokensPerMinute: 1"))
		Expect(s.admits(100, "b-ci", "ops")).To(Equal(map[string]int{"b-ci": 429, "ops": 429}), "under Flat a tenant's Global binds the fleet")

		s.in(s.home, fleet("Namespaces"))
		Expect(s.admits(100, "b-ci", "ops", "a-ci")).To(Equal(map[string]int{"b-ci": 200, "ops": 200, "a-ci": 429}),
			"under Namespaces it binds its own tenant only")

		s.in(s.home, fleet("Flat"))
		Expect(s.admits(100, "b-ci", "ops")).To(Equal(map[string]int{"b-ci": 429, "ops": 429}), "back to Flat")
	})
})
