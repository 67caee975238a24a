// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package controllers_test

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	twv1alpha1 "github.com/tokenwarden/tokenwarden/api/v1alpha1"
	"github.com/tokenwarden/tokenwarden/controllers/render"
	"github.com/tokenwarden/tokenwarden/proxy/attribute"
	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/proxy/cache"
	"github.com/tokenwarden/tokenwarden/proxy/config"
	"github.com/tokenwarden/tokenwarden/proxy/metrics"
	"github.com/tokenwarden/tokenwarden/proxy/server"
	"github.com/tokenwarden/tokenwarden/test/fakellm"
)

// attrRequest sends one request to the proxy at url and returns its status.
type attrRequest func(url string) int

func send(key, path, body string, hdr ...string) attrRequest {
	return func(url string) int {
		GinkgoHelper()
		req, err := http.NewRequest("POST", url+path, strings.NewReader(body))
		Expect(err).NotTo(HaveOccurred())
		req.Header.Set("Authorization", "Bearer "+key)
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		resp, err := http.DefaultClient.Do(req)
		Expect(err).NotTo(HaveOccurred())
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
}

const (
	gptBody    = `{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}],"max_tokens":5}`
	claudeBody = `{"model":"claude","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`
)

func aliceChat(hdr ...string) attrRequest {
	return send("sk-alice", "/v1/chat/completions", gptBody, hdr...)
}

// attrEntry is one attribute through the operator: its values in appliesWhen (ns is
// the fleet's namespace, where alice is; ns2 the tenant namespace, where bob is), a
// request that holds them and one that does not, and whether the spec counts by it
// too (the attributes beyond the dimensions).
type attrEntry struct {
	attr    twv1alpha1.CountBy
	values  func(ns, ns2 string) []string
	countBy bool
	a, b    attrRequest
}

func vals(v ...string) func(_, _ string) []string { return func(_, _ string) []string { return v } }

var attrEntries = []attrEntry{
	{twv1alpha1.CountByTenant, func(_, ns2 string) []string { return []string{ns2} }, false, send("sk-bob", "/v1/chat/completions", gptBody), aliceChat()},
	{twv1alpha1.CountByAPIKey, vals("alice"), false, aliceChat(), send("sk-bob", "/v1/chat/completions", gptBody)},
	{twv1alpha1.CountByUser, vals("alice"), false, aliceChat(), send("sk-bob", "/v1/chat/completions", gptBody)},
	{twv1alpha1.CountByTeam, vals("research"), false, aliceChat(), send("sk-bob", "/v1/chat/completions", gptBody)},
	{twv1alpha1.CountByModel, vals("gpt-4o"), false, aliceChat(), send("sk-alice", "/v1/chat/completions", strings.Replace(gptBody, "gpt-4o", "gpt-4o-mini", 1))},
	{twv1alpha1.CountByProvider, vals("Anthropic"), true, send("sk-alice", "/v1/messages", claudeBody), aliceChat()},
	{twv1alpha1.CountByEndpoint, vals("ChatCompletions"), true, aliceChat(), send("sk-alice", "/v1/messages", claudeBody)},
	{twv1alpha1.CountByEnvironment, vals("production"), true, aliceChat(), send("sk-bob", "/v1/chat/completions", gptBody)},
	{twv1alpha1.CountBySession, vals("s-1"), true, aliceChat(attribute.SessionHeader, "s-1"), aliceChat(attribute.SessionHeader, "s-2")},
	{twv1alpha1.CountByAgent, vals("planner"), true, aliceChat(attribute.AgentHeader, "planner"), aliceChat(attribute.AgentHeader, "coder")},
	{twv1alpha1.CountByTask, vals("t-1"), true, aliceChat(attribute.TaskHeader, "t-1"), aliceChat(attribute.TaskHeader, "t-2")},
	{twv1alpha1.CountByRun, vals("r-1"), true, aliceChat(attribute.RunHeader, "r-1"), aliceChat(attribute.RunHeader, "r-2")},
	{twv1alpha1.CountByRequestFingerprint, vals((&cache.Request{Scope: "key:alice", Route: "/v1/chat/completions", Upstream: "main",
		Model: "gpt-4o", Header: http.Header{}, Body: []byte(gptBody)}).Key().String()), true,
		aliceChat(), send("sk-alice", "/v1/chat/completions", strings.Replace(gptBody, "hi", "hello", 1))},
}

// attributeFleet is a fleet of two upstreams (claude serves the model claude, main
// everything else) on a fake backend, with alice in its namespace (environment
// production) and bob in a tenant namespace (environment staging), and the budgets.
// It runs one proxy on the document the operator rendered and returns its URL.
func attributeFleet(budgets func(ns, ns2 string) []*twv1alpha1.TokenBudget) (url, ns, ns2 string) {
	GinkgoHelper()
	return attributeFleetOn(fakellm.New(), budgets)
}

// attributeFleetOn is attributeFleet on the fake backend given.
func attributeFleetOn(backend *fakellm.Server, budgets func(ns, ns2 string) []*twv1alpha1.TokenBudget) (url, ns, ns2 string) {
	GinkgoHelper()
	ns, ns2 = newNamespace("attrs"), newNamespace("attrs-tenant")
	for n, env := range map[string]string{ns: "production", ns2: "staging"} {
		var o corev1.Namespace
		Expect(k8sClient.Get(ctx, client.ObjectKey{Name: n}, &o)).To(Succeed())
		o.Labels = map[string]string{render.EnvironmentLabel: env}
		Expect(k8sClient.Update(ctx, &o)).To(Succeed())
	}
	be := httptest.NewServer(backend)
	DeferCleanup(be.Close)
	tp := fleetProxy(ns, 1)
	tp.Spec.Upstreams = []twv1alpha1.Upstream{
		{Name: "claude", URL: be.URL, Models: []string{"claude"}, Provider: twv1alpha1.ProviderAnthropic},
		{Name: "main", URL: be.URL, Provider: twv1alpha1.ProviderOpenAI},
	}
	tp.Spec.AllowedNamespaces = twv1alpha1.AllowedNamespaces{From: twv1alpha1.NamespacesFromAll}
	bob := apiKey(ns2, "bob", "bob", "bob", "support")
	bob.Spec.ProxyRef.Namespace = ns
	objs := []client.Object{tp, keySecret(ns, "alice", "sk-alice"), apiKey(ns, "alice", "alice", "alice", "research"),
		keySecret(ns2, "bob", "sk-bob"), bob}
	for _, b := range budgets(ns, ns2) {
		objs = append(objs, b)
	}
	for _, o := range objs {
		Expect(k8sClient.Create(ctx, o)).To(Succeed())
	}
	want := len(budgets(ns, ns2))
	var doc []byte
	Eventually(func(g Gomega) {
		c := rendered(g, ns)
		g.Expect(c.RateLimiting.Rules).To(HaveLen(want))
		g.Expect(c.APIKeys).To(HaveLen(2))
		doc = document(g, ns)
	}).Should(Succeed())
	mem := budget.NewMemory(budget.SystemClock{}, 1000)
	srv := server.New(server.Options{Store: mem, Memory: mem, Metrics: metrics.New(prometheus.NewRegistry()), Logger: slog.New(slog.NewTextHandler(GinkgoWriter, nil))})
	_, err := srv.Apply(doc, "test")
	Expect(err).NotTo(HaveOccurred())
	front := httptest.NewServer(srv)
	DeferCleanup(front.Close)
	return front.URL, ns, ns2
}

var _ = Describe("Request attributes from TokenBudget to proxy", func() {
	DescribeTable("a budget's appliesWhen and countBy, rendered by the operator, are what the proxy enforces",
		func(e attrEntry) {
			url, ns, _ := attributeFleet(func(ns, ns2 string) []*twv1alpha1.TokenBudget {
				out := []*twv1alpha1.TokenBudget{ruleBudget(ns, "when", twv1alpha1.DimensionGlobal, func(s *twv1alpha1.TokenBudgetSpec) {
					s.Amount, s.Windows = twv1alpha1.AmountRequests, windows(rollingWindow("1", twv1alpha1.PeriodMinute, 0))
					s.AppliesWhen = []twv1alpha1.AttributeSelector{{Attribute: e.attr, Values: e.values(ns, ns2)}}
				})}
				if e.countBy {
					out = append(out, ruleBudget(ns, "each", twv1alpha1.DimensionGlobal, func(s *twv1alpha1.TokenBudgetSpec) {
						s.Amount, s.Windows, s.CountBy = twv1alpha1.AmountRequests, windows(rollingWindow("2", twv1alpha1.PeriodMinute, 0)), e.attr
					}))
				}
				return out
			})
			Expect(e.a(url)).To(Equal(200))
			Expect(e.a(url)).To(Equal(429), "the second request that holds the value is the one a minute appliesWhen allows")
			Expect(e.b(url)).To(Equal(200), "appliesWhen does not govern another value")
			Expect(e.b(url)).To(Equal(200))
			if e.countBy {
				Expect(e.b(url)).To(Equal(429), "countBy keeps another value's two requests a minute apart")
			}

			By("kubectl get shows what the budget applies to and counts by")
			Eventually(func(g Gomega) {
				g.Expect(getColumns(g, ns, "when")["APPLIES WHEN"]).To(HavePrefix(strings.ToLower(string(e.attr[:1]))))
				if e.countBy {
					g.Expect(getColumns(g, ns, "each")["COUNT BY"]).NotTo(BeEmpty())
				}
			}).Should(Succeed())
		},
		func() []TableEntry {
			var out []TableEntry
			for _, e := range attrEntries {
				out = append(out, Entry(string(e.attr), e))
			}
			return out
		}(),
	)

	It("renders each attribute in the proxy's words, a tenant's values in its own namespace", func() {
		_, ns, ns2 := attributeFleet(func(ns, ns2 string) []*twv1alpha1.TokenBudget {
			return []*twv1alpha1.TokenBudget{
				ruleBudget(ns, "planner-chat", twv1alpha1.DimensionPerAPIKey, func(s *twv1alpha1.TokenBudgetSpec) {
					s.CountBy, s.Windows = twv1alpha1.CountBySession, windows(rollingWindow("200k", twv1alpha1.PeriodMinute, 0))
					s.AppliesWhen = []twv1alpha1.AttributeSelector{
						{Attribute: twv1alpha1.CountByEndpoint, Values: []string{"ChatCompletions", "Responses"}},
						{Attribute: twv1alpha1.CountByAgent, Values: []string{"planner"}},
					}
				}),
				ruleBudget(ns2, "own-team", twv1alpha1.DimensionGlobal, func(s *twv1alpha1.TokenBudgetSpec) {
					s.ProxyRef.Namespace = ns
					s.Windows = windows(rollingWindow("100k", twv1alpha1.PeriodMinute, 0))
					s.AppliesWhen = []twv1alpha1.AttributeSelector{{Attribute: twv1alpha1.CountByTeam, Values: []string{"support"}},
						{Attribute: twv1alpha1.CountByAPIKey, Values: []string{"bob"}}}
				}),
			}
		})
		rules := rulesOf(Default, ns)
		i := slices.IndexFunc(rules, func(r config.Rule) bool { return r.Name == ns+"/planner-chat" })
		Expect(i).To(BeNumerically(">=", 0))
		Expect(rules[i].CountBy).To(Equal(config.RuleSession))
		Expect(rules[i].AppliesWhen).To(Equal(map[config.RuleDimension][]string{
			config.RuleEndpoint: {"chat_completions", "responses"}, config.RuleAgent: {"planner"}}))
		j := slices.IndexFunc(rules, func(r config.Rule) bool { return r.Name == ns2+"/own-team" })
		Expect(rules[j].AppliesWhen).To(Equal(map[config.RuleDimension][]string{
			config.RuleTeam: {ns2 + "/support"}, config.RuleAPIKey: {ns2 + "_bob"}}), "a tenant's team and key are its own")
		Expect(rendered(Default, ns).APIKeys).To(ContainElements(
			HaveField("Environment", "production"), HaveField("Environment", "staging")))
		Eventually(func(g Gomega) {
			cols := getColumns(g, ns, "planner-chat")
			g.Expect(cols["APPLIES WHEN"]).To(Equal("endpoint=chat_completions,responses agent=planner"))
			g.Expect(cols["COUNT BY"]).To(Equal("session"))
		}).Should(Succeed())
	})
})
