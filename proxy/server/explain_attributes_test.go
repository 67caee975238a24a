// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package server_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/tokenwarden/tokenwarden/proxy/attribute"
	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/proxy/explain"
)

// explained reads /admin/explain with a query.
func explained(h *harness, query string) (int, explain.Answer) {
	GinkgoHelper()
	admin := httptest.NewServer(h.srv.AdminHandler(h.reg))
	defer admin.Close()
	resp, err := http.Get(admin.URL + "/admin/explain?" + query)
	Expect(err).NotTo(HaveOccurred())
	defer resp.Body.Close()
	var a explain.Answer
	if resp.StatusCode == http.StatusOK {
		Expect(json.NewDecoder(resp.Body).Decode(&a)).To(Succeed())
	}
	return resp.StatusCode, a
}

// budgetOf is the explained budget of a rule.
func budgetOf(a explain.Answer, rule string) *budget.Explained {
	GinkgoHelper()
	for i := range a.Budgets {
		if a.Budgets[i].Rule == rule {
			return &a.Budgets[i]
		}
	}
	Fail("no budget of rule " + rule)
	return nil
}

var _ = Describe("/admin/explain with request attributes", func() {
	const doc = attributesDoc + `  - {name: each-session, dimension: api_key, count_by: session, amount: requests, windows: [{limit: 100, rolling: {period: minute}}]}
  - {name: planner, dimension: team, amount: requests, applies_when: {agent: [planner]}, windows: [{limit: 50, rolling: {period: minute}}]}
  - {name: per-upstream, dimension: global, count_by: provider, amount: requests, windows: [{limit: 500, rolling: {period: minute}}]}
  max_attribute_values: 2
`
	It("shows each rule's attribute values, the counter they land in, and a value beyond the bound in the overflow subject", func() {
		h := newHarness(doc)
		for _, s := range []string{"s-0", "s-1"} {
			Expect(chatWith("sk-alice", attribute.SessionHeader, s)(h).code).To(Equal(200))
		}

		code, a := explained(h, "api_key=alice&model=gpt-4o&session=s-1&agent=coder")
		Expect(code).To(Equal(200))
		Expect(a.Attributes).To(HaveKeyWithValue("session", "s-1"))
		Expect(a.Attributes).To(HaveKeyWithValue("provider", "openai"))
		Expect(a.Attributes).To(HaveKeyWithValue("upstream", "default"))
		Expect(a.Attributes).To(HaveKeyWithValue("environment", "production"))
		Expect(a.MaxAttributeValues).To(Equal(int64(2)))

		s := budgetOf(a, "each-session")
		Expect(s.Attributes).To(Equal([]budget.AttributeValue{{Attribute: "session", Use: "count_by", Value: "s-1"}}))
		Expect(s.Subject).To(Equal("alice"))
		Expect(s.By).To(Equal("s-1"), "a session the key already sent keeps its counter")
		Expect(s.Overflow).To(BeFalse())
		Expect(*s.Remaining).To(Equal(99.0), "its counter holds s-1's one request")

		p := budgetOf(a, "per-upstream")
		Expect(p.Attributes).To(Equal([]budget.AttributeValue{{Attribute: "provider", Use: "count_by", Value: "default", Upstream: "default"}}))
		Expect(p.By).To(Equal("default"))

		Expect(a.NotSelected).To(Equal([]budget.NotSelected{{Rule: "planner", Window: "minute",
			Attribute: budget.AttributeValue{Attribute: "agent", Use: "applies_when", Value: "coder"}, Values: []string{"planner"}}}))

		_, a = explained(h, "api_key=alice&model=gpt-4o&session=s-9&agent=planner")
		s = budgetOf(a, "each-session")
		Expect(s.Overflow).To(BeTrue(), "alice has sent max_attribute_values sessions this minute")
		Expect(s.By).To(Equal(budget.Overflow))
		Expect(budgetOf(a, "planner").Attributes).To(Equal([]budget.AttributeValue{{Attribute: "agent", Use: "applies_when", Value: "planner"}}))
		Expect(a.NotSelected).To(BeEmpty())
		Expect(h.store.ValuesHeld("each-session", 0, "alice")).To(Equal(2), "explain adds no value")

		_, a = explained(h, "api_key=alice&model=claude&route=/v1/messages")
		Expect(budgetOf(a, "each-session").Attributes).To(Equal([]budget.AttributeValue{{Attribute: "session", Use: "count_by", Absent: true}}),
			"a request without the header is the key's one value without an id")
		Expect(budgetOf(a, "each-session").Overflow).To(BeTrue())
		Expect(budgetOf(a, "per-upstream").By).To(Equal("claude-up"))
		Expect(a.Attributes).To(HaveKeyWithValue("provider", "anthropic"))
		Expect(a.Attributes).To(HaveKeyWithValue("endpoint", "messages"))

		Expect(explained(h, "api_key=alice&session=my%20session")).To(Equal(400), "an attribute out of the headers' bounds")
		Expect(explained(h, "api_key=alice&model=gpt-4o&upstream=nowhere")).To(Equal(400))
	})
})
