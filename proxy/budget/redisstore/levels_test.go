// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package redisstore_test

import (
	"context"
	"fmt"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/proxy/budget/redisstore"
	"github.com/tokenwarden/tokenwarden/proxy/budget/storetest"
)

var _ = Describe("usage scan of the shared buckets", func() {
	It("reports every token bucket of the fleet's prefix, whichever replica drew on it, and no other fleet's", func() {
		start := time.Now()
		prefix := fmt.Sprintf("t%d", prefixes.Add(1))
		replica := func() *redisstore.Store {
			s, err := redisstore.New(redisstore.Options{URL: srv.URL(), Prefix: prefix, Clock: storetest.NewClock()})
			Expect(err).NotTo(HaveOccurred())
			DeferCleanup(s.Close)
			return s
		}
		replicaA := replica()
		other := newStore(storetest.NewClock(), nil, nil) // another fleet: another prefix
		DeferCleanup(other.Close)
		ctx := context.Background()
		charge := func(kind budget.Kind, dim budget.Dimension, id string, c float64) budget.Charge {
			return budget.Charge{Key: budget.Key{Kind: kind, Dim: dim, ID: id}, SharedCapacity: c, SharedRate: c * still}
		}
		reserve := func(s budget.Store, amount int64, cs ...budget.Charge) {
			GinkgoHelper()
			res, err := s.Reserve(ctx, &budget.Reservation{Tokens: budget.WithAmount(cs, float64(amount)),
				Requests: []budget.Charge{{Key: budget.Key{Kind: budget.Requests, Dim: budget.Global}, SharedCapacity: 1e6, SharedRate: 1e6, Amount: 1}}})
			Expect(err).NotTo(HaveOccurred())
			Expect(res.Admitted).To(BeTrue())
		}
		global := charge(budget.TokensDay, budget.Global, "", 1e6)
		// More subjects than one SCAN step returns: the scan follows the cursor.
		const subjects = 1200
		for i := range subjects {
			reserve(replicaA, 100, charge(budget.TokensMinute, budget.APIKey, fmt.Sprintf("key-%d", i), 1000), global)
		}
		reserve(other, 700, charge(budget.TokensMinute, budget.APIKey, "key-0", 1000))

		// A second replica of the fleet: a store of its own on the same prefix.
		replicaB := replica()
		type lv struct{ level, capacity float64 }
		got := map[budget.Key]lv{}
		Expect(replicaB.EachLevel(ctx, func(k budget.Key, level, capacity float64) {
			Expect(got).NotTo(HaveKey(k))
			got[k] = lv{level, capacity}
		})).To(Succeed())
		// Request buckets are not reported: the global key holds one, beside its day bucket.
		Expect(got).To(HaveLen(subjects + 1))
		for i := range subjects {
			l := got[budget.Key{Kind: budget.TokensMinute, Dim: budget.APIKey, ID: fmt.Sprintf("key-%d", i)}]
			Expect(l.capacity).To(Equal(1000.0))
			Expect(l.level).To(BeNumerically("~", 900, slack(1000*still, start)))
		}
		g := got[global.Key]
		Expect(g.capacity).To(Equal(1e6))
		Expect(g.level).To(BeNumerically("~", 1e6-100*subjects, slack(1e6*still, start)))
	})

	It("fails when Redis cannot be read, so that the replica reports its own share instead", func() {
		own, s := ownStore()
		Expect(own.Kill()).To(Succeed())
		Expect(s.EachLevel(context.Background(), func(budget.Key, float64, float64) {})).To(HaveOccurred())
	})
})
