// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package server_test

import (
	"context"
	"fmt"
	"net/http"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/proxy/explain"
	"github.com/tokenwarden/tokenwarden/test/redisserver"
)

// clusterInFlightDoc adds to the per-session rule a fleet's total of three requests in
// flight: its counter is the global subject's, in another slot group than alice's.
const clusterInFlightDoc = fleetSessionInFlightDoc + `  - name: three-in-the-fleet
    dimension: global
    amount: in_flight
    windows: [{limit: 3}]
`

var _ = Describe("In-flight rules on a Redis Cluster", func() {
	It("hold totals in two slot groups across three proxies, a refusal by the second group giving back the first's slot, and every end both", func() {
		cluster := redisserver.StartCluster(GinkgoT(), 3, 0)
		h, g := gated(sessionInFlightDoc)
		prefix := fmt.Sprintf("inflightcluster%d", redisPrefixes.Add(1))
		doc := fmt.Sprintf(clusterInFlightDoc, cluster.URL())
		var ps []*redisProxy
		for range 3 {
			ps = append(ps, fleetProxy(h, cluster.URL(), prefix, doc))
		}
		global := ps[0].store.SubjectPrefix(budget.Key{Dim: budget.Global})
		alice := ps[0].store.SubjectPrefix(budget.Key{Dim: budget.APIKey, ID: "alice"})
		Expect(redisserver.Slot(global)).NotTo(Equal(redisserver.Slot(alice)), "the two windows' counters are in two slot groups: %s, %s", global, alice)

		By("two of session s1 in flight, on two proxies")
		out := make(chan sent, 4)
		sendVia(context.Background(), ps[0].url, out, "a1", "sk-alice", session("s1")...)
		Eventually(func() int { return len(g.order()) }).Should(Equal(1))
		sendVia(context.Background(), ps[1].url, out, "a2", "sk-alice", session("s1")...)
		Eventually(func() int { return len(g.order()) }).Should(Equal(2))
		_, b := explainedInFlight(ps[2].srv, "s1")
		Expect(*b.InFlight).To(Equal(int64(2)))
		Expect(b.InFlightOf).To(Equal("fleet"))

		By("a third of s1: the fleet's window takes its slot, the session's refuses")
		for _, p := range ps {
			expectInFlightRefusal(sessionChat(h, p.url, "sk-alice", "s1"), "a third request of s1")
		}
		a, err := ps[1].srv.Explain(context.Background(), explain.Query{APIKey: "alice", Model: "gpt-4o", Session: "s2"})
		Expect(err).NotTo(HaveOccurred())
		Expect(*budgetOf(a, "three-in-the-fleet").InFlight).To(Equal(int64(2)), "the fleet's slots taken for the refused requests were given back")

		By("another session takes the fleet's third slot; a fourth in the fleet is refused by it")
		sendVia(context.Background(), ps[2].url, out, "b1", "sk-alice", session("s2")...)
		Eventually(func() int { return len(g.order()) }).Should(Equal(3), "the fleet's third slot is free")
		r := sessionChat(h, ps[0].url, "sk-bob", "s9")
		Expect(r.code).To(Equal(http.StatusTooManyRequests), r.body)
		Expect(r.errorField("error", "code")).To(Equal("in_flight_limit"))
		g.release()
		for range 3 {
			Expect((<-out).code).To(Equal(http.StatusOK))
		}

		By("every way a request ends gives back the slots of both groups")
		slotsBackOnEveryEnd(h, ps)
		for _, rule := range []string{"two-per-session", "three-in-the-fleet"} {
			Eventually(func() int64 {
				a, err := ps[2].srv.Explain(context.Background(), explain.Query{APIKey: "alice", Model: "gpt-4o", Session: "s1"})
				Expect(err).NotTo(HaveOccurred())
				return *budgetOf(a, rule).InFlight
			}).Should(BeZero(), "%s: no slot left behind", rule)
		}
	})
})
