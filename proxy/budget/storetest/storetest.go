// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

// Package storetest is the behaviour suite every budget.Store must pass, and a fake
// clock. The memory store and the Redis store run the same specs.
package storetest

import (
	"context"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
)

// Clock is a settable clock; tests move it instead of sleeping for a refill.
type Clock struct {
	mu  sync.Mutex
	now time.Time
}

// NewClock starts at a fixed instant.
func NewClock() *Clock { return &Clock{now: time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)} }

// Now implements budget.Clock.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock forward.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// Factory builds a fresh, empty store on a clock, bounded to maxBuckets per kind.
// Level reads a bucket's level (ok false when absent) for assertions.
type Factory struct {
	New   func(clock budget.Clock, maxBuckets int64) budget.Store
	Level func(s budget.Store, k budget.Key) (float64, bool)
	// Bounded: the store bounds its bucket maps by maxBuckets (memory does; Redis
	// bounds itself by expiry).
	Bounded bool
	// Prunes: Prune drops buckets at once (memory does; shared keys expire instead).
	Prunes bool
}

// charge is a bucket whose replica-local and shared parameters are the same, so the
// specs hold for a memory store and a shared store alike.
func charge(kind budget.Kind, dim budget.Dimension, id string, capacity, rate float64) budget.Charge {
	return budget.Charge{Key: budget.Key{Kind: kind, Dim: dim, ID: id}, Capacity: capacity, Rate: rate, SharedCapacity: capacity, SharedRate: rate}
}

// minute is a token bucket of tpm tokens per minute.
func minute(dim budget.Dimension, id string, tpm float64) budget.Charge {
	return charge(budget.TokensMinute, dim, id, tpm, tpm/60)
}

func day(dim budget.Dimension, id string, tpd float64) budget.Charge {
	return charge(budget.TokensDay, dim, id, tpd, tpd/86400)
}

func requests(dim budget.Dimension, id string, rps, burst float64) budget.Charge {
	return charge(budget.Requests, dim, id, burst, rps)
}

// DescribeStore declares the behaviour specs for one store implementation.
func DescribeStore(name string, f Factory) bool {
	Describe(name+" store behaviour", func() {
		var (
			clock *Clock
			store budget.Store
			ctx   = context.Background()
		)
		BeforeEach(func() {
			clock = NewClock()
			store = f.New(clock, 1000)
			DeferCleanup(store.Close)
		})
		level := func(c budget.Charge) float64 {
			l, ok := f.Level(store, c.Key)
			if !ok {
				return c.Capacity // an absent bucket is full
			}
			return l
		}
		reserve := func(amount int64, reqs []budget.Charge, toks ...budget.Charge) budget.Result {
			res, err := store.Reserve(ctx, &budget.Reservation{Requests: reqs, Tokens: toks, Amount: amount})
			Expect(err).NotTo(HaveOccurred())
			return res
		}

		It("takes the amount from every bucket when all of them cover it", func() {
			g, k := minute(budget.Global, "", 6000), minute(budget.APIKey, "a", 1200)
			res := reserve(1000, nil, g, k)
			Expect(res.Admitted).To(BeTrue())
			Expect(res.TokenLevels).To(Equal([]float64{5000, 200}))
			Expect(level(g)).To(BeNumerically("~", 5000, 0.001))
			Expect(level(k)).To(BeNumerically("~", 200, 0.001))
		})

		It("takes nothing from any bucket when one cannot cover the request", func() {
			g, k := minute(budget.Global, "", 6000), minute(budget.APIKey, "a", 1200)
			Expect(reserve(1000, nil, g, k).Admitted).To(BeTrue())
			res := reserve(500, nil, g, k)
			Expect(res.Admitted).To(BeFalse())
			Expect(res.RefusedBy).To(Equal(budget.TokensMinute))
			Expect(res.Refused).To(Equal(1))
			Expect(level(g)).To(BeNumerically("~", 5000, 0.001), "the global budget must not be drained by a refusal on api_key")
		})

		It("never drains the day budget on a minute refusal", func() {
			m, d := minute(budget.APIKey, "a", 600), day(budget.APIKey, "a", 100000)
			Expect(reserve(600, nil, m, d).Admitted).To(BeTrue())
			res := reserve(100, nil, m, d)
			Expect(res.Admitted).To(BeFalse())
			Expect(res.RefusedBy).To(Equal(budget.TokensMinute))
			Expect(level(d)).To(BeNumerically("~", 99400, 0.01))
		})

		It("refills continuously at the rate, up to the capacity", func() {
			m := minute(budget.Global, "", 600) // 10 tokens per second
			Expect(reserve(600, nil, m).Admitted).To(BeTrue())
			clock.Advance(3 * time.Second)
			Expect(reserve(31, nil, m).Admitted).To(BeFalse())
			Expect(reserve(30, nil, m).Admitted).To(BeTrue())
			clock.Advance(time.Hour)
			Expect(level(m)).To(BeNumerically("~", 600, 0.001))
		})

		It("refuses a request larger than the whole bucket at once, with a size-aware Retry-After", func() {
			m := minute(budget.Global, "", 600)
			res := reserve(1200, nil, m)
			Expect(res.Admitted).To(BeFalse())
			Expect(res.RetryAfter).To(BeNumerically("~", 120*time.Second, time.Millisecond), "the time to refill the request's own cost")
			Expect(level(m)).To(BeNumerically("~", 600, 0.001))
		})

		It("reports Retry-After as the time until the bucket holds the request", func() {
			m := minute(budget.Global, "", 600)
			Expect(reserve(500, nil, m).Admitted).To(BeTrue())
			res := reserve(300, nil, m) // 100 left, 200 missing at 10/s
			Expect(res.Admitted).To(BeFalse())
			Expect(res.RetryAfter).To(BeNumerically("~", 20*time.Second, time.Millisecond))
		})

		It("gives the longest wait of every bucket that refuses", func() {
			a, b := minute(budget.Global, "", 600), minute(budget.Team, "t", 60)
			Expect(reserve(60, nil, a, b).Admitted).To(BeTrue())
			res := reserve(60, nil, a, b) // a has room, b needs 60 tokens at 1/s
			Expect(res.Admitted).To(BeFalse())
			Expect(res.RetryAfter).To(BeNumerically("~", 60*time.Second, time.Millisecond))
		})

		It("refuses every positive reservation on a zero allowance", func() {
			z := charge(budget.TokensMinute, budget.Global, "", 0, 0)
			res := reserve(1, nil, z)
			Expect(res.Admitted).To(BeFalse())
			Expect(res.RetryAfter).To(Equal(time.Minute))
		})

		It("takes nothing when a request-count bucket refuses, and the request only when a token bucket refuses", func() {
			r := requests(budget.APIKey, "a", 1, 2)
			m := minute(budget.APIKey, "a", 600)
			Expect(reserve(600, []budget.Charge{r}, m).Admitted).To(BeTrue())
			res := reserve(10, []budget.Charge{r}, m)
			Expect(res.Admitted).To(BeFalse())
			Expect(res.RefusedBy).To(Equal(budget.TokensMinute))
			Expect(level(r)).To(BeNumerically("~", 0, 0.001), "the request-count bucket admitted the request before the token check")
			res = reserve(10, []budget.Charge{r}, m)
			Expect(res.Admitted).To(BeFalse())
			Expect(res.RefusedBy).To(Equal(budget.Requests))
			Expect(res.RetryAfter).To(BeNumerically("~", time.Second, time.Millisecond))
			Expect(level(m)).To(BeNumerically("~", 0, 0.001))
		})

		It("refunds up to the capacity and no further", func() {
			m := minute(budget.Global, "", 600)
			Expect(reserve(100, nil, m).Admitted).To(BeTrue())
			store.Refund(ctx, []budget.Charge{m}, 60)
			Expect(level(m)).To(BeNumerically("~", 560, 0.001))
			store.Refund(ctx, []budget.Charge{m}, 1000)
			Expect(level(m)).To(BeNumerically("~", 600, 0.001))
		})

		It("charges an overage only to a bucket that can cover it", func() {
			a, b := minute(budget.Global, "", 6000), minute(budget.APIKey, "k", 600)
			Expect(reserve(550, nil, a, b).Admitted).To(BeTrue())
			applied := store.Charge(ctx, []budget.Charge{a, b}, 100)
			Expect(applied).To(Equal([]bool{true, false}))
			Expect(level(a)).To(BeNumerically("~", 5350, 0.001))
			Expect(level(b)).To(BeNumerically("~", 50, 0.001), "an overage the bucket cannot cover consumes nothing")
		})

		It("keeps the fraction drawn down when a bucket's capacity changes", func() {
			old := minute(budget.Global, "", 600)
			Expect(reserve(450, nil, old).Admitted).To(BeTrue()) // 25% left
			halved := minute(budget.Global, "", 300)
			res := reserve(1, nil, halved)
			Expect(res.Admitted).To(BeTrue())
			Expect(level(halved)).To(BeNumerically("~", 74, 0.01))
		})

		It("settles a hold on the parameters it recorded after the capacity changed", func() {
			old := minute(budget.Global, "", 600)
			Expect(reserve(600, nil, old).Admitted).To(BeTrue())
			halved := minute(budget.Global, "", 300)
			Expect(reserve(0, nil, halved).Admitted).To(BeTrue()) // rebuilt at 0 of 300
			store.Refund(ctx, []budget.Charge{old}, 600)          // the whole old hold back
			Expect(level(halved)).To(BeNumerically("~", 300, 0.01))
		})

		if f.Prunes {
			It("drops buckets that a reload no longer configures", func() {
				a, b := minute(budget.APIKey, "gone", 600), minute(budget.APIKey, "kept", 600)
				Expect(reserve(100, nil, a, b).Admitted).To(BeTrue())
				store.Prune(func(k budget.Key) bool { return k.ID == "kept" })
				_, ok := f.Level(store, a.Key)
				Expect(ok).To(BeFalse())
				Expect(level(b)).To(BeNumerically("~", 500, 0.001))
			})
		}

		if f.Bounded {
			It("admits without charge when the bucket map is full, and says so", func() {
				small := f.New(clock, 2)
				DeferCleanup(small.Close)
				for _, id := range []string{"a", "b"} {
					res, err := small.Reserve(ctx, &budget.Reservation{Tokens: []budget.Charge{minute(budget.Client, id, 600)}, Amount: 600})
					Expect(err).NotTo(HaveOccurred())
					Expect(res.Admitted).To(BeTrue())
				}
				res, err := small.Reserve(ctx, &budget.Reservation{Tokens: []budget.Charge{minute(budget.Client, "c", 600)}, Amount: 600})
				Expect(err).NotTo(HaveOccurred())
				Expect(res.Admitted).To(BeTrue())
				Expect(res.TokenSkipped).To(Equal([]bool{true}))
			})
		}

		It("never admits more than the capacity under concurrent reservations", func() {
			m := minute(budget.Global, "", 1000)
			var wg sync.WaitGroup
			var mu sync.Mutex
			admitted := 0
			for i := 0; i < 50; i++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					defer GinkgoRecover()
					res, err := store.Reserve(ctx, &budget.Reservation{Tokens: []budget.Charge{m}, Amount: 100})
					Expect(err).NotTo(HaveOccurred())
					if res.Admitted {
						mu.Lock()
						admitted++
						mu.Unlock()
					}
				}()
			}
			wg.Wait()
			Expect(admitted).To(Equal(10))
		})
	})
	return true
}
