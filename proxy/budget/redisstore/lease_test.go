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
)

// leasingStore is a store on url that serves hot shared budgets from slices of
// fraction of their capacity.
func leasingStore(url, prefix string, fraction float64) *redisstore.Store {
	s, err := redisstore.New(redisstore.Options{
		URL: url, Prefix: prefix, LeaseFraction: fraction,
		DialTimeout: 200 * time.Millisecond, ReadTimeout: 200 * time.Millisecond, WriteTimeout: 200 * time.Millisecond,
	})
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(s.Close)
	return s
}

var _ = Describe("Leased slices of hot shared budgets", func() {
	ctx := context.Background()
	const capacity = 400
	global := bucket(budget.Global, "", capacity)

	for _, layout := range []string{"one server", "a cluster"} {
		url := func() string {
			if layout == "one server" {
				return srv.URL()
			}
			return cluster.URL()
		}
		It("lets two replicas spend the global budget in slices and admit exactly its total, on "+layout, func() {
			prefix := fmt.Sprintf("l%d", prefixes.Add(1))
			a, b := leasingStore(url(), prefix, 0.05), leasingStore(url(), prefix, 0.05)
			stop := make(chan struct{})
			load := &fleetLoad{}
			load.run([]*redisstore.Store{a, b}, 16, func(i int) []budget.Charge {
				return []budget.Charge{global, bucket(budget.APIKey, fmt.Sprint("k", i%7), 1000)}
			}, stop)
			Eventually(load.refused.Load).WithTimeout(10 * time.Second).Should(BeNumerically(">", 200))
			close(stop)
			load.wg.Wait()
			Expect(load.errs.Load()).To(BeZero())
			Expect(load.shared.Load()).To(BeEquivalentTo(capacity), "the slices come out of the bucket: the fleet admits its total, no more, and spends what the replicas held")
			takes := a.LeaseTakes() + b.LeaseTakes()
			GinkgoWriter.Printf("%d admissions on %d slices\n", load.shared.Load(), takes)
			Expect(takes).To(BeNumerically("<=", capacity/20+2), "one call to the global bucket per slice of 20, not per request")
		})
	}

	It("returns an idle slice to the shared bucket", func() {
		s := leasingStore(cluster.URL(), fmt.Sprintf("l%d", prefixes.Add(1)), 0.05)
		res, err := s.Reserve(ctx, &budget.Reservation{Tokens: []budget.Charge{global}})
		Expect(err).NotTo(HaveOccurred())
		Expect(res.Admitted).To(BeTrue())
		level := func() float64 {
			l, _, err := s.Level(ctx, global.Key)
			Expect(err).NotTo(HaveOccurred())
			return l
		}
		Expect(level()).To(BeNumerically("~", capacity-20, 0.5), "a slice of 20 taken")
		Eventually(level).WithTimeout(5*time.Second).WithPolling(50*time.Millisecond).
			Should(BeNumerically("~", capacity-1, 0.5), "the 19 unspent went back within about a second")
	})

	It("returns what a replica holds when it closes", func() {
		prefix := fmt.Sprintf("l%d", prefixes.Add(1))
		s, err := redisstore.New(redisstore.Options{URL: srv.URL(), Prefix: prefix, LeaseFraction: 0.25,
			DialTimeout: time.Second, ReadTimeout: time.Second, WriteTimeout: time.Second})
		Expect(err).NotTo(HaveOccurred())
		res, err := s.Reserve(ctx, &budget.Reservation{Tokens: []budget.Charge{global}})
		Expect(err).NotTo(HaveOccurred())
		Expect(res.Admitted).To(BeTrue())
		reader := fleetStore(srv.URL(), prefix, nil)
		level := func() float64 {
			l, _, err := reader.Level(ctx, global.Key)
			Expect(err).NotTo(HaveOccurred())
			return l
		}
		Expect(level()).To(BeNumerically("~", capacity-100, 0.5), "a slice of a quarter taken")
		Expect(s.Close()).To(Succeed())
		Expect(level()).To(BeNumerically("~", capacity-1, 0.5), "the 99 unspent went back before Close returned")
	})
})
