// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package recovery_test

import (
	"net/http"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

// spendUntilRefused sends alice's requests to r one at a time until one is refused
// with 429, and returns how many were admitted.
func (f *fbFleet) spendUntilRefused(r *fbReplica, from int) int {
	GinkgoHelper()
	for n := 0; n < 1000; n++ {
		a := ask(r.front.URL, "sk-alice", "gpt-4o", from+n)
		if a.status == http.StatusTooManyRequests {
			return n
		}
		Expect(a.status).To(Equal(http.StatusOK), a.body)
	}
	Fail("never refused")
	return 0
}

// setReplicas is a reload of budget_division.replicas on each replica given.
func setReplicas(n int64, rs ...*fbReplica) {
	for _, r := range rs {
		r.fallback.SetReplicas(n)
	}
}

var _ = Describe("The ledger fallback while the fleet's size changes during an outage", func() {
	// One request at a time: none is open when a replica reads the ledger, and no
	// flush but the spec's, so the documented bound is the budget itself.
	const budgetUSD = 0.02

	It("keeps the fleet within the budget when a replica leaves after spending its share", func() {
		f := newFallbackFleet(3, budgetUSD, 0)
		r0, r1, r2 := f.replicas[0], f.replicas[1], f.replicas[2]
		for i := range 5 {
			Expect(ask(r0.front.URL, "sk-alice", "gpt-4o", i).status).To(Equal(http.StatusOK))
		}
		f.flushAll()
		Expect(f.rs.Kill()).To(Succeed())
		// Every replica reads the ledger at its first request; r2 spends its share.
		Expect(ask(r0.front.URL, "sk-alice", "gpt-4o", 100).status).To(Equal(http.StatusOK))
		Expect(ask(r1.front.URL, "sk-alice", "gpt-4o", 200).status).To(Equal(http.StatusOK))
		left := f.spendUntilRefused(r2, 300)
		// r2 leaves, flushing what it holds, and the fleet is two.
		f.flushAll()
		r2.front.Close()
		setReplicas(2, r0, r1)
		more := f.spendUntilRefused(r0, 1000) + f.spendUntilRefused(r1, 2000)
		f.flushAll()

		spent := f.spent()
		GinkgoWriter.Printf("r2 admitted %d before it left, r0 and r1 %d more after; spent $%.6f of $%.2f\n", left, more, spent, budgetUSD)
		Expect(left).To(BeNumerically(">", 5))
		Expect(spent).To(BeNumerically("<=", budgetUSD+1e-9), "the shares of the two left and what r2 spent add up to no more than the remainder")
	})

	It("shrinks each replica's share when the fleet grows, so the newcomer's fits the remainder", func() {
		f := newFallbackFleet(3, budgetUSD, 0)
		r0, r1, r2 := f.replicas[0], f.replicas[1], f.replicas[2]
		setReplicas(2, r0, r1, r2) // r2 is not yet one of the fleet
		for i := range 5 {
			Expect(ask(r0.front.URL, "sk-alice", "gpt-4o", i).status).To(Equal(http.StatusOK))
		}
		f.flushAll()
		Expect(f.rs.Kill()).To(Succeed())
		Expect(ask(r1.front.URL, "sk-alice", "gpt-4o", 200).status).To(Equal(http.StatusOK))
		half := f.spendUntilRefused(r0, 100)
		// The fleet grows to three; r0's spend is flushed before r2 reads the ledger
		// (within a flush interval of it: the documented bound's flush term).
		f.flushAll()
		setReplicas(3, r0, r1, r2)
		more := f.spendUntilRefused(r0, 1000) + f.spendUntilRefused(r1, 2000) + f.spendUntilRefused(r2, 3000)
		f.flushAll()

		spent := f.spent()
		GinkgoWriter.Printf("r0 admitted %d of half the remainder, then the fleet of three %d more; spent $%.6f of $%.2f\n", half, more, spent, budgetUSD)
		Expect(more).To(BeNumerically(">", 0), "the newcomer and r1 still had shares")
		Expect(spent).To(BeNumerically("<=", budgetUSD+1e-9))
	})
})
