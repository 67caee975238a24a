// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package redisstore_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/proxy/budget/redisstore"
	"github.com/tokenwarden/tokenwarden/proxy/budget/storetest"
	"github.com/tokenwarden/tokenwarden/test/redisserver"
)

// clusterStore is a store on url (a cluster or a sentinel), with its own key prefix.
func clusterStore(url string, fallback *budget.Memory) *redisstore.Store {
	return fleetStore(url, fmt.Sprintf("c%d", prefixes.Add(1)), fallback)
}

// fleetStore is a store on url with the given key prefix: stores with one prefix are
// replicas of one fleet.
func fleetStore(url, prefix string, fallback *budget.Memory) *redisstore.Store {
	s, err := redisstore.New(redisstore.Options{
		URL: url, Prefix: prefix,
		DialTimeout: 200 * time.Millisecond, ReadTimeout: 200 * time.Millisecond, WriteTimeout: 200 * time.Millisecond,
		Fallback: fallback, Backoff: 50 * time.Millisecond,
	})
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(s.Close)
	return s
}

var _ = storetest.DescribeStore("redis cluster", storetest.Factory{
	New: func(clock budget.Clock, _ int64) budget.Store {
		s, err := redisstore.New(redisstore.Options{
			URL: cluster.URL(), Prefix: fmt.Sprintf("c%d", prefixes.Add(1)),
			DialTimeout: 200 * time.Millisecond, ReadTimeout: 200 * time.Millisecond, WriteTimeout: 200 * time.Millisecond,
			Backoff: 300 * time.Millisecond, Clock: clock,
		})
		Expect(err).NotTo(HaveOccurred())
		return s
	},
	Level: func(s budget.Store, k budget.Key) (float64, bool) {
		l, ok, err := s.(*redisstore.Store).Level(context.Background(), k)
		Expect(err).NotTo(HaveOccurred())
		return l, ok
	},
	OwnClock: true,
})

// bucket is a token bucket of a dimension and id that refills next to nothing while a
// test runs.
func bucket(dim budget.Dimension, id string, capacity float64) budget.Charge {
	return budget.Charge{Key: budget.Key{Kind: budget.TokensDay, Dim: dim, ID: id},
		Capacity: capacity / 3, Rate: still / 3, SharedCapacity: capacity, SharedRate: still, Amount: 1}
}

// fleetLoad reserves one token on the global bucket and on a per-key bucket from
// workers goroutines spread over the stores until stop closes, refunding nothing.
// It counts the admissions on Redis (shared) and on the fallback, and the errors.
type fleetLoad struct {
	shared, local, refused, errs atomic.Int64
	wg                           sync.WaitGroup
}

func (f *fleetLoad) run(stores []*redisstore.Store, workers int, charges func(i int) []budget.Charge, stop <-chan struct{}) {
	for w := range workers {
		f.wg.Add(1)
		go func() {
			defer GinkgoRecover()
			defer f.wg.Done()
			s := stores[w%len(stores)]
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				res, err := s.Reserve(context.Background(), &budget.Reservation{Tokens: charges(w*1_000_000 + i)})
				switch {
				case err != nil:
					f.errs.Add(1)
				case !res.Admitted:
					f.refused.Add(1)
				case res.Shared:
					f.shared.Add(1)
				default:
					f.local.Add(1)
				}
			}
		}()
	}
}

var _ = Describe("A Redis Cluster", func() {
	ctx := context.Background()

	It("spreads the subjects over slot groups and keeps each subject's buckets in one slot", func() {
		s := clusterStore(cluster.URL(), nil)
		k := budget.Key{Kind: budget.TokensDay, Dim: budget.APIKey, ID: "alice"}
		rule := budget.Key{Kind: budget.Rolling, Dim: budget.APIKey, ID: "alice", Rule: "r"}
		Expect(redisserver.Slot(s.Key(k))).To(Equal(redisserver.Slot(s.Key(rule))), "one subject, one slot")
		masters := map[string]bool{}
		for i := range 30 {
			masters[cluster.MasterOf(GinkgoT(), s.Key(budget.Key{Dim: budget.APIKey, ID: fmt.Sprint("key-", i)})).Addr()] = true
		}
		Expect(masters).To(HaveLen(3), "thirty subjects land on every master")
	})

	It("enforces one total from two stores, on buckets of several slot groups", func() {
		prefix := fmt.Sprintf("c%d", prefixes.Add(1))
		a, b := fleetStore(cluster.URL(), prefix, nil), fleetStore(cluster.URL(), prefix, nil)
		Expect(redisserver.Slot(a.Key(bucket(budget.Global, "", 1).Key))).NotTo(Equal(redisserver.Slot(a.Key(bucket(budget.APIKey, "k", 1).Key))))
		stop := make(chan struct{})
		load := &fleetLoad{}
		load.run([]*redisstore.Store{a, b}, 16, func(int) []budget.Charge {
			return []budget.Charge{bucket(budget.Global, "", 300), bucket(budget.APIKey, "k", 200)}
		}, stop)
		Eventually(load.refused.Load).WithTimeout(10 * time.Second).Should(BeNumerically(">", 100))
		close(stop)
		load.wg.Wait()
		Expect(load.errs.Load()).To(BeZero())
		Expect(load.shared.Load()).To(BeEquivalentTo(200), "the per-key bucket admits its 200 and no more")
		// The global bucket gave 200 and got back what the refusals took from it.
		Eventually(func() float64 {
			l, _, err := b.Level(ctx, bucket(budget.Global, "", 300).Key)
			Expect(err).NotTo(HaveOccurred())
			return l
		}).WithTimeout(5 * time.Second).Should(BeNumerically("~", 100, 0.5))
		Expect(a.Releases() + b.Releases()).To(BeNumerically(">", 100), "each refusal by the per-key bucket released the global one")
	})
})
