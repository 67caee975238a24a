// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package server_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/tokenwarden/tokenwarden/proxy/server"
)

// refusals reads /admin/refusals with a query.
func refusals(h *harness, query string) []server.KeyRefusals {
	GinkgoHelper()
	admin := httptest.NewServer(h.srv.AdminHandler(h.reg))
	defer admin.Close()
	resp, err := http.Get(admin.URL + "/admin/refusals" + query)
	Expect(err).NotTo(HaveOccurred())
	defer resp.Body.Close()
	Expect(resp.StatusCode).To(Equal(200))
	var out struct {
		APIKeys []server.KeyRefusals `json:"api_keys"`
	}
	Expect(json.NewDecoder(resp.Body).Decode(&out)).To(Succeed())
	return out.APIKeys
}

const auditDoc = `
observability:
  refusal_audit: {per_key: 2}
` + keysDoc + `  limits:
    per_api_key: {tokens_per_minute: 1000}
    global: {tokens_per_minute: 1500}
`

var _ = Describe("The refusal audit", func() {
	It("keeps each key's last refusals, newest first, with what the caller's own budget had left", func() {
		h := newObservedHarness(auditDoc, server.Options{AccessLog: &logLines{}})
		h.llm.Set(fakellmUsage(100, 0))
		Expect(h.chat("sk-alice", 900).code).To(Equal(200)) // 921 reserved, 100 used: 900 left
		var ids []string
		var msgs []string
		for _, max := range []int{2000, 950, 960} {
			r := h.chat("sk-alice", max)
			Expect(r.code).To(Equal(429))
			ids = append(ids, id(r))
			msgs = append(msgs, r.errorField("error", "message").(string))
		}
		Expect(h.chat("sk-bob", 10).code).To(Equal(200))

		all := refusals(h, "")
		Expect(all).To(HaveLen(1), "bob was never refused")
		Expect(all[0].APIKey).To(Equal("alice"))
		got := all[0].Refusals
		Expect(got).To(HaveLen(2), "refusal_audit.per_key bounds the list")
		Expect(got[0].RequestID).To(Equal(ids[2]))
		Expect(got[1].RequestID).To(Equal(ids[1]))

		last := got[0]
		Expect(last.Route).To(Equal("/v1/chat/completions"))
		Expect(last.Model).To(Equal("gpt-4o"))
		Expect(last.Limit).To(Equal("token_budget"))
		Expect(last.Dimension).To(Equal("api_key"))
		Expect(last.Period).To(Equal("minute"))
		Expect(last.TokensReserved).To(Equal(int64(chatEstimate(960))))
		Expect(last.Asked).To(Equal(chatEstimate(960)))
		Expect(last.Capacity).To(HaveValue(Equal(1000.0)))
		Expect(last.Remaining).To(HaveValue(BeNumerically("<", chatEstimate(960))))
		Expect(last.RetryAfterSeconds).To(BeNumerically(">", 0))
		Expect(last.LargerThanBudget).To(BeFalse())
		Expect(last.Message).To(Equal(msgs[2]), "the message the client got")
		Expect(last.Time).NotTo(BeZero())

		Expect(refusals(h, "?api_key=bob")).To(Equal([]server.KeyRefusals{{APIKey: "bob", Refusals: []server.AuditedRefusal{}}}))
	})

	It("never tells a shared budget's level", func() {
		h := newObservedHarness(auditDoc, server.Options{AccessLog: &logLines{}})
		// Bob uses 1000 of the global 1500: alice's 921 fit her own budget, not the
		// global one.
		h.llm.Set(fakellmUsage(1000, 0))
		r := h.chat("sk-bob", 900)
		Expect(r.code).To(Equal(200))
		r = h.chat("sk-alice", 900)
		Expect(r.code).To(Equal(429))
		got := refusals(h, "?api_key=alice")
		Expect(got).To(HaveLen(1))
		Expect(got[0].Refusals).To(HaveLen(1))
		e := got[0].Refusals[0]
		Expect(e.Dimension).To(Equal("global"))
		Expect(e.Capacity).To(BeNil())
		Expect(e.Remaining).To(BeNil())
		Expect(e.Asked).To(Equal(chatEstimate(900)))
	})

	It("forgets the refusals of a key the config no longer names", func() {
		h := newObservedHarness(auditDoc, server.Options{AccessLog: &logLines{}})
		Expect(h.chat("sk-bob", 2000).code).To(Equal(429))
		Expect(refusals(h, "?api_key=bob")[0].Refusals).To(HaveLen(1))
		Expect(h.apply(`
observability:
  refusal_audit: {per_key: 2}
upstreams:
- name: default
  url: UPSTREAM
api_keys:
- {name: alice, key_sha256: HASH(alice), user: alice, team: research}
rate_limiting:
  budget_division: {replicas: 1}
`)).To(Succeed())
		Expect(refusals(h, "")).To(BeEmpty())
	})
})
