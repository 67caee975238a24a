// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package redisstore_test

import (
	"context"
	"errors"
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
	// sharedRefused are the refusals Redis decided.
	sharedRefused atomic.Int64
	// settled counts the holds settled on the backend that took them; with settle set,
	// every admission settles (a refund of nothing, so the levels stay as they were).
	settle  bool
	settled atomic.Int64
	wg      sync.WaitGroup
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
					if res.Shared {
						f.sharedRefused.Add(1)
					}
				case res.Shared:
					f.shared.Add(1)
				default:
					f.local.Add(1)
				}
				if err == nil && res.Admitted && f.settle {
					res.Backend.Refund(context.Background(), budget.WithAmount(charges(0), 0))
					f.settled.Add(1)
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
		Expect(a.Releases()+b.Releases()).To(BeNumerically(">", 100), "each refusal by the per-key bucket released the global one")
	})
})

var _ = Describe("Failover and resharding under load", func() {
	ctx := context.Background()
	// global is the fleet's global bucket: 400 tokens that never refill while the test
	// runs. Each reservation takes one.
	const capacity = 400
	charges := func(int) []budget.Charge { return []budget.Charge{bucket(budget.Global, "", capacity)} }

	It("moves a slot under load (ASK, then MOVED) without an error or a lost admission", func() {
		s := clusterStore(cluster.URL(), nil)
		key := s.Key(bucket(budget.Global, "", capacity).Key)
		from := cluster.MasterOf(GinkgoT(), key)
		to := cluster.Masters[0]
		if to == from {
			to = cluster.Masters[1]
		}
		stop := make(chan struct{})
		load := &fleetLoad{}
		load.run([]*redisstore.Store{s}, 8, charges, stop)
		Eventually(load.shared.Load).Should(BeNumerically(">", 50))
		cluster.MoveSlot(GinkgoT(), redisserver.Slot(key), from, to)
		Expect(cluster.MasterOf(GinkgoT(), key)).To(Equal(to))
		Eventually(load.refused.Load).WithTimeout(10 * time.Second).Should(BeNumerically(">", 50))
		close(stop)
		load.wg.Wait()
		Expect(load.errs.Load()).To(BeZero())
		Expect(load.local.Load()).To(BeZero(), "no call failed over to the fallback")
		// A reservation whose reply was lost in a redirect counts high, never low.
		GinkgoWriter.Printf("admitted while the slot moved: %d of %d\n", load.shared.Load(), capacity)
		Expect(load.shared.Load()).To(BeNumerically("<=", capacity), "the bucket moved whole: never more than its capacity")
		Expect(load.shared.Load()).To(BeNumerically(">=", capacity-8), "at most the reservations in flight counted high")
	})

	It("kills a master under load: the fallback takes over, nothing beyond its share, and the replica carries on", func() {
		withReplicas := redisserver.StartCluster(GinkgoT(), 3, 1)
		fallback := budget.NewMemory(budget.SystemClock{}, 100)
		s := clusterStore(withReplicas.URL(), fallback)
		key := s.Key(bucket(budget.Global, "", capacity).Key)
		stop := make(chan struct{})
		load := &fleetLoad{settle: true}
		load.run([]*redisstore.Store{s}, 8, charges, stop)
		Eventually(load.shared.Load).Should(BeNumerically(">", 50))
		master := withReplicas.MasterOf(GinkgoT(), key)
		sharedBefore := load.shared.Load()
		Expect(master.Kill()).To(Succeed())
		Eventually(load.local.Load).Should(BeNumerically(">", 0), "admission falls back while the slot has no master")
		Eventually(func() bool {
			m := withReplicas.MasterOf(GinkgoT(), key)
			return m != nil && m != master
		}).WithTimeout(20*time.Second).Should(BeTrue(), "the replica took over the slot")
		withReplicas.WaitOK(GinkgoT())
		Eventually(load.sharedRefused.Load).WithTimeout(15*time.Second).Should(BeNumerically(">", 50), "back on Redis, which spent the bucket")
		close(stop)
		load.wg.Wait()
		Expect(load.errs.Load()).To(BeZero(), "every admission was answered")
		Expect(load.settled.Load()).To(Equal(load.shared.Load()+load.local.Load()), "every hold settled where it was taken")
		Expect(load.local.Load()).To(BeNumerically("<=", capacity/3), "the fallback admits at most the replica's divided share")
		// The replica holds what the master wrote, up to the replication lag: the fleet
		// admits its capacity, plus at most the writes the failover lost, minus the
		// reservations whose reply the dying master never sent (they count high).
		GinkgoWriter.Printf("admitted on Redis before the kill: %d; in all: %d of %d\n", sharedBefore, load.shared.Load(), capacity)
		Expect(load.shared.Load()).To(BeNumerically("~", capacity, 8), "at most the reservations in flight when the master died")
		l, _, err := s.Level(ctx, bucket(budget.Global, "", capacity).Key)
		Expect(err).NotTo(HaveOccurred())
		Expect(l).To(BeNumerically("<", 1), "the bucket is spent on the promoted replica")
	})

	It("follows a Sentinel failover under load", func() {
		st := redisserver.StartSentinel(GinkgoT(), 1, 1)
		fallback := budget.NewMemory(budget.SystemClock{}, 100)
		s := clusterStore(st.URL(), fallback)
		stop := make(chan struct{})
		load := &fleetLoad{settle: true}
		load.run([]*redisstore.Store{s}, 8, charges, stop)
		Eventually(load.shared.Load).Should(BeNumerically(">", 50))
		old := st.Primary(GinkgoT())
		Expect(old.Kill()).To(Succeed())
		Eventually(load.local.Load).Should(BeNumerically(">", 0), "admission falls back while there is no primary")
		st.WaitPrimary(GinkgoT(), old)
		Eventually(load.sharedRefused.Load).WithTimeout(15*time.Second).Should(BeNumerically(">", 50), "back on Redis, which spent the bucket")
		close(stop)
		load.wg.Wait()
		Expect(load.errs.Load()).To(BeZero())
		Expect(load.settled.Load()).To(Equal(load.shared.Load()+load.local.Load()), "every hold settled where it was taken")
		Expect(load.local.Load()).To(BeNumerically("<=", capacity/3))
		GinkgoWriter.Printf("admitted on Redis: %d of %d\n", load.shared.Load(), capacity)
		Expect(load.shared.Load()).To(BeNumerically("~", capacity, 8), "at most the reservations in flight when the primary died")
	})
})

var _ = Describe("The trust fence on a cluster", func() {
	ctx := context.Background()
	durable := func(id string) []budget.Charge {
		return []budget.Charge{{Key: budget.Key{Kind: budget.Rolling, Dim: budget.APIKey, ID: id, Rule: "cost"},
			Capacity: 100, Rate: still, SharedCapacity: 100, SharedRate: still, Amount: 1, Durable: true}}
	}
	It("fences the slot groups of a master that lost its data, and only those", func() {
		own := redisserver.StartCluster(GinkgoT(), 3, 0)
		s := clusterStore(own.URL(), nil)
		// Subjects on two different masters.
		a := "alice"
		var b string
		for i := 0; ; i++ {
			b = fmt.Sprint("bob-", i)
			if own.MasterOf(GinkgoT(), s.Key(durable(b)[0].Key)) != own.MasterOf(GinkgoT(), s.Key(durable(a)[0].Key)) {
				break
			}
		}
		for _, id := range []string{a, b} {
			res, err := s.Reserve(ctx, &budget.Reservation{Tokens: durable(id)})
			Expect(err).NotTo(HaveOccurred())
			Expect(res.Admitted).To(BeTrue())
		}
		epoch := s.Epochs()[0].Epoch
		Expect(epoch).NotTo(BeEmpty())
		// alice's master loses its data (a restart without persistence keeps its
		// slots, not its keys).
		Expect(own.MasterOf(GinkgoT(), s.Key(durable(a)[0].Key)).Client().FlushAll(ctx).Err()).To(Succeed())
		_, err := s.Reserve(ctx, &budget.Reservation{Tokens: durable(a)})
		var rec *budget.RecoveringError
		Expect(errors.As(err, &rec)).To(BeTrue(), "alice's group lost its epoch: %v", err)
		res, err := s.Reserve(ctx, &budget.Reservation{Tokens: durable(b)})
		Expect(err).NotTo(HaveOccurred(), "bob's group kept its epoch")
		Expect(res.Admitted).To(BeTrue())
		e := s.Epochs()[0]
		Expect(e.Fenced).To(BeTrue())
		Expect(e.SlotGroups).To(HaveLen(1))
		// Attesting writes a new epoch into every group and lifts the fence.
		after, err := s.Attest(ctx, nil)
		Expect(err).NotTo(HaveOccurred())
		Expect(after).NotTo(Equal(epoch))
		res, err = s.Reserve(ctx, &budget.Reservation{Tokens: durable(a)})
		Expect(err).NotTo(HaveOccurred())
		Expect(res.Admitted).To(BeTrue())
		Expect(s.Epochs()[0].Fenced).To(BeFalse())
	})
})

var _ = Describe("Usage on a cluster", func() {
	It("reads every subject's buckets from every master", func() {
		ctx := context.Background()
		prefix := fmt.Sprintf("c%d", prefixes.Add(1))
		a, b := fleetStore(cluster.URL(), prefix, nil), fleetStore(cluster.URL(), prefix, nil)
		want := map[string]float64{}
		for i := range 30 {
			id := fmt.Sprint("key-", i)
			ch := bucket(budget.APIKey, id, 1000)
			ch.Amount = float64(i + 1)
			rule := budget.Charge{Key: budget.Key{Kind: budget.Rolling, Dim: budget.APIKey, ID: id, Rule: "hourly"},
				Capacity: 500, Rate: still, SharedCapacity: 500, SharedRate: still, Amount: 2}
			res, err := a.Reserve(ctx, &budget.Reservation{Tokens: []budget.Charge{ch, rule}})
			Expect(err).NotTo(HaveOccurred())
			Expect(res.Admitted).To(BeTrue())
			want[id] = 1000 - float64(i+1)
			want["hourly/"+id] = 498
		}
		got := map[string]float64{}
		Expect(b.EachLevel(ctx, func(k budget.Key, level, _ float64) {
			name := k.ID
			if k.Rule != "" {
				name = k.Rule + "/" + k.ID
			}
			got[name] = level
		})).To(Succeed())
		Expect(got).To(HaveLen(len(want)))
		for name, l := range want {
			Expect(got[name]).To(BeNumerically("~", l, 0.01), name)
		}
	})
})
