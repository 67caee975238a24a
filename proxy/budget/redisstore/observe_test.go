// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package redisstore_test

import (
	"context"
	"fmt"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/proxy/budget/redisstore"
	"github.com/tokenwarden/tokenwarden/proxy/metrics"
	"github.com/tokenwarden/tokenwarden/test/redisserver"
)

// watchedStore is a store of the fleet prefix on url that records into fresh metrics.
func watchedStore(url, prefix string, fraction float64) (*redisstore.Store, *metrics.Metrics) {
	m := metrics.New(prometheus.NewRegistry())
	s, err := redisstore.New(redisstore.Options{
		URL: url, Prefix: prefix, LeaseFraction: fraction, Recorder: m,
		DialTimeout: 200 * time.Millisecond, ReadTimeout: 200 * time.Millisecond, WriteTimeout: 200 * time.Millisecond,
	})
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(func() { _ = s.Close() }) // a spec may close it first
	return s, m
}

// releases reads tokenwarden_redis_slot_group_releases_total{result}.
func releases(m *metrics.Metrics, result string) float64 {
	return testutil.ToFloat64(m.RedisShared.Releases.WithLabelValues(result))
}

var _ = Describe("Watching the slot groups' releases", func() {
	ctx := context.Background()
	const capacity = 400
	global := bucket(budget.Global, "", capacity)

	// refusedLater is a reservation the global bucket admits and a per-key bucket of 5
	// tokens, in a slot group on another master than the global one's, refuses.
	refusedLater := func(c *redisserver.Cluster, s *redisstore.Store) *budget.Reservation {
		var key budget.Charge
		for i := 0; ; i++ {
			key = bucket(budget.APIKey, fmt.Sprint("k", i), 5)
			if c.MasterOf(GinkgoT(), s.Key(key.Key)) != c.MasterOf(GinkgoT(), s.Key(global.Key)) {
				break
			}
		}
		return &budget.Reservation{Tokens: budget.WithAmount([]budget.Charge{global, key}, 10)}
	}
	level := func(s *redisstore.Store) func() (float64, error) {
		return func() (float64, error) {
			l, _, err := s.Level(ctx, global.Key)
			return l, err
		}
	}

	It("counts a release returned when a later group refuses", func() {
		s, m := watchedStore(cluster.URL(), fmt.Sprintf("o%d", prefixes.Add(1)), 0)
		res, err := s.Reserve(ctx, refusedLater(cluster, s))
		Expect(err).NotTo(HaveOccurred())
		Expect(res.Admitted).To(BeFalse(), "the per-key bucket of 5 refuses 10")
		Expect(releases(m, "returned")).To(Equal(1.0))
		Expect(releases(m, "lost")).To(BeZero())
		Expect(level(s)()).To(BeNumerically("~", capacity, 0.5), "the global bucket got its 10 back")
	})

	It("counts a release lost when the master dies between the reservation and the release: the budget stays charged by the reservation, no more", func() {
		own := redisserver.StartCluster(GinkgoT(), 3, 1)
		prefix := fmt.Sprintf("o%d", prefixes.Add(1))
		s, m := watchedStore(own.URL(), prefix, 0)
		r := refusedLater(own, s)
		master := own.MasterOf(GinkgoT(), s.Key(global.Key))
		// The global group is reserved; before its release is sent, its master has
		// replicated the reservation and dies.
		s.BeforeRelease(func() {
			defer GinkgoRecover()
			Expect(master.Client().Do(ctx, "WAIT", 1, 5000).Val()).To(BeEquivalentTo(1), "the replica holds the reservation")
			Expect(master.Kill()).To(Succeed())
		})
		res, err := s.Reserve(ctx, r)
		Expect(err).NotTo(HaveOccurred())
		Expect(res.Admitted).To(BeFalse())
		Expect(releases(m, "lost")).To(Equal(1.0), "the release could not reach the global group's master")
		Expect(releases(m, "returned")).To(BeZero())

		Eventually(func() bool {
			n := own.MasterOf(GinkgoT(), s.Key(global.Key))
			return n != nil && n != master
		}).WithTimeout(20*time.Second).Should(BeTrue(), "the replica took over the global group")
		own.WaitOK(GinkgoT())
		reader, _ := watchedStore(own.URL(), prefix, 0)
		Expect(level(reader)()).To(BeNumerically("~", capacity-10, 0.5),
			"the lost release leaves the global bucket charged by the reservation's 10: high, never low, and no more")
	})
})

var _ = Describe("Watching leased slices", func() {
	ctx := context.Background()
	const capacity = 400
	global := bucket(budget.Global, "", capacity)
	day := budget.TokensDay.String()
	held := func(m *metrics.Metrics) float64 {
		return testutil.ToFloat64(m.RedisShared.SliceHeld.WithLabelValues("global", day))
	}
	slices := func(m *metrics.Metrics, event string) float64 {
		return testutil.ToFloat64(m.RedisShared.Slices.WithLabelValues("global", day, event))
	}

	It("counts slices leased and returned and the tokens held", func() {
		s, m := watchedStore(cluster.URL(), fmt.Sprintf("o%d", prefixes.Add(1)), 0.05)
		for range 3 {
			res, err := s.Reserve(ctx, &budget.Reservation{Tokens: []budget.Charge{global}})
			Expect(err).NotTo(HaveOccurred())
			Expect(res.Admitted).To(BeTrue())
		}
		Expect(slices(m, "leased")).To(Equal(1.0), "one slice of 20 served three requests")
		Expect(held(m)).To(BeNumerically("~", 17, 1e-9), "20 leased, 3 spent")
		s.Refund(ctx, budget.WithAmount([]budget.Charge{global}, 1))
		Expect(held(m)).To(BeNumerically("~", 18, 1e-9), "a refund goes back to the slice")
		Eventually(func() float64 { return slices(m, "returned") }).WithTimeout(5*time.Second).WithPolling(50*time.Millisecond).
			Should(Equal(1.0), "the idle slice went back within about a second")
		Expect(held(m)).To(BeZero())
		// The slice is counted returned when its refund is sent, not when Redis applied it.
		Eventually(func() (float64, error) {
			l, _, err := s.Level(ctx, global.Key)
			return l, err
		}).Should(BeNumerically("~", capacity-2, 0.5), "what the gauge said was held is back in the bucket")
	})

	It("counts a slice the bucket cannot give whole, and returns what is held at close", func() {
		s, m := watchedStore(srv.URL(), fmt.Sprintf("o%d", prefixes.Add(1)), 0.5)
		res, err := s.Reserve(ctx, &budget.Reservation{Tokens: []budget.Charge{global}})
		Expect(err).NotTo(HaveOccurred())
		Expect(res.Admitted).To(BeTrue())
		Expect(held(m)).To(BeNumerically("~", 199, 1e-9), "a slice of half the bucket, one token spent")
		// 300 is more than the 199 held: the store asks for a slice of 300, and the
		// bucket holds 200.
		res, err = s.Reserve(ctx, &budget.Reservation{Tokens: budget.WithAmount([]budget.Charge{global}, 300)})
		Expect(err).NotTo(HaveOccurred())
		Expect(res.Admitted).To(BeFalse(), "decided in Redis: the bucket holds 200")
		Expect(testutil.ToFloat64(m.RedisShared.SliceRefusals.WithLabelValues("global", day))).To(Equal(1.0))
		Expect(held(m)).To(BeNumerically("~", 199, 1e-9), "the slice held is untouched")
		Expect(s.Close()).To(Succeed())
		Expect(slices(m, "returned")).To(Equal(1.0))
		Expect(held(m)).To(BeZero(), "nothing held once closed")
	})
})
