// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package recovery_test

import (
	"context"
	"net/http"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

var _ = Describe("The ledger fallback when replicas flush between their reads", func() {
	// docs/ledger.md, "The overspend bound": budget + O + F + D. One request at a
	// time leaves O nothing to count and no spool drops (D): the term tried is F,
	// at most (1 - 1/replicas) of what the replicas held unflushed when Redis went
	// away, ΣU, each replica's U being what it admitted in its last flush interval.
	// With three replicas: budget + 2/3·ΣU.
	//
	// Exactly: a replica that flushes its U before its own read counts it in its L,
	// where it takes U/3 from its share, and in the L of every replica that reads
	// after it, instead of in its P, where it takes all of it. r0 reads first with
	// its U0 in P, r1 flushes and reads, r2 flushes and reads: the fleet spends
	// budget + U1·(1 - 2/3) + U2·(1 - 1/3) = budget + U1/3 + 2·U2/3, within
	// budget + 2/3·(U0 + U1 + U2), less what each replica's last refused
	// reservation leaves unspent of its share.
	const budgetUSD = 0.02

	It("keeps the fleet within the budget plus the flush term", func() {
		f := newFallbackFleet(3, budgetUSD, 0)
		r0, r1, r2 := f.replicas[0], f.replicas[1], f.replicas[2]
		// On Redis, each replica's last flush interval, none of it flushed: the last
		// reader holds the most, where the term is largest.
		held := []int{2, 4, 12}
		for i, r := range f.replicas {
			for j := range held[i] {
				Expect(ask(r.front.URL, "sk-alice", "gpt-4o", i*100+j).status).To(Equal(http.StatusOK))
			}
		}
		f.waitSettled()
		u := make([]float64, 3)
		sum := 0.0
		for i, n := range held {
			u[i] = float64(n) * requestCost
			sum += u[i]
		}
		Expect(f.rs.Kill()).To(Succeed())

		// r0 reads with its U0 in P; r1, then r2, flush and read.
		Expect(ask(r0.front.URL, "sk-alice", "gpt-4o", 1000).status).To(Equal(http.StatusOK))
		f.flush(r1)
		Expect(ask(r1.front.URL, "sk-alice", "gpt-4o", 2000).status).To(Equal(http.StatusOK))
		f.flush(r2)
		Expect(ask(r2.front.URL, "sk-alice", "gpt-4o", 3000).status).To(Equal(http.StatusOK))
		n := f.spendUntilRefused(r0, 1001) + f.spendUntilRefused(r1, 2001) + f.spendUntilRefused(r2, 3001)
		f.flushAll()

		spent := f.spent()
		bound := budgetUSD + 2.0/3.0*sum
		exact := budgetUSD + u[1]/3 + 2*u[2]/3
		GinkgoWriter.Printf("held unflushed $%.4f (U = %v requests); %d more admitted on the ledger; spent $%.6f: "+
			"budget $%.2f, exact term's $%.6f, documented bound $%.6f\n", sum, held, n+3, spent, budgetUSD, exact, bound)
		Expect(spent).To(BeNumerically("<=", bound+1e-9), "the documented bound: budget + 2/3 of what the replicas held unflushed")
		Expect(spent).To(BeNumerically("<=", exact+1e-9), "the term as derived for these reads")
		Expect(spent).To(BeNumerically(">=", exact-3*maxReservation-1e-9),
			"each replica stops within a reservation of its share: the flush term was spent, beyond the budget")
	})
})

// waitSettled waits for every replica's settlements, flushing none.
func (f *fbFleet) waitSettled() {
	GinkgoHelper()
	for _, r := range f.replicas {
		wctx, cancel := context.WithTimeout(f.ctx, 10*time.Second)
		Expect(r.srv.WaitSettled(wctx)).To(Succeed())
		cancel()
	}
}

// flush waits for r's settlements and flushes its ledger.
func (f *fbFleet) flush(r *fbReplica) {
	GinkgoHelper()
	wctx, cancel := context.WithTimeout(f.ctx, 10*time.Second)
	defer cancel()
	Expect(r.srv.WaitSettled(wctx)).To(Succeed())
	Expect(r.l.Flush(wctx)).To(Succeed())
}
