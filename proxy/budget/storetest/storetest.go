// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

// Package storetest is the behaviour suite every budget.Store must pass, and a fake
// clock. The memory store and the Redis store run the same specs.
package storetest

import (
	"context"
	"fmt"
	"math"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/onsi/gomega/types"

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

// Factory builds a fresh, empty store on a clock, bounded to maxBuckets per dimension
// and kind. Level reads a bucket's level (ok false when absent) for assertions.
type Factory struct {
	New   func(clock budget.Clock, maxBuckets int64) budget.Store
	Level func(s budget.Store, k budget.Key) (float64, bool)
	// Bounded: the store bounds its bucket maps by maxBuckets (memory does; Redis
	// bounds itself by expiry).
	Bounded bool
	// Prunes: Prune drops buckets at once (memory does; shared keys expire instead).
	Prunes bool
	// OwnClock: the store keeps its own time (a shared store reads the Redis server's
	// clock, so that replica clocks never enter a shared bucket). The fake clock does
	// not move its buckets; real time does, so the specs wait for real time where they
	// need a refill, and allow for the refill that real time brings between two steps.
	OwnClock bool
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

// rule is a rule's rolling bucket of limit an hour, which refills next to nothing
// while a spec runs.
func rule(dim budget.Dimension, id, name string, limit float64) budget.Charge {
	c := charge(budget.Rolling, dim, id, limit, limit/3600)
	c.Key.Rule = name
	return c
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
			// began is when the spec began, on the fake clock and in real time.
			began, beganReal time.Time
		)
		BeforeEach(func() {
			clock = NewClock()
			began, beganReal = clock.Now(), time.Now()
			store = f.New(clock, 1000)
			DeferCleanup(store.Close)
		})
		// elapsed bounds the time the store's clock has moved since the spec began.
		elapsed := func() time.Duration {
			if f.OwnClock {
				return time.Since(beganReal)
			}
			return clock.Now().Sub(began)
		}
		// elapse lets d pass on the store's clock: the fake clock moves; a store with its
		// own clock needs the real time to pass, so it waits (the specs that need a
		// refill use fast buckets and keep such waits under a second in all).
		elapse := func(d time.Duration) {
			clock.Advance(d)
			if f.OwnClock {
				time.Sleep(d)
			}
		}
		// near matches a bucket's level: exact for a store on the fake clock, and up to
		// what real time can have refilled since the spec began for one on its own.
		near := func(c budget.Charge, want float64) types.GomegaMatcher {
			slack := 1e-3
			if f.OwnClock {
				slack += c.Rate * time.Since(beganReal).Seconds()
			}
			return BeNumerically("~", want, slack)
		}
		// nearWait matches a Retry-After the same way: real time's refill shortens it.
		nearWait := func(want time.Duration) types.GomegaMatcher {
			slack := time.Millisecond
			if f.OwnClock {
				slack += time.Since(beganReal)
			}
			return BeNumerically("~", want, slack)
		}
		level := func(c budget.Charge) float64 {
			l, ok := f.Level(store, c.Key)
			if !ok {
				return c.Capacity // an absent bucket is full
			}
			return l
		}
		reserve := func(amount int64, reqs []budget.Charge, toks ...budget.Charge) budget.Result {
			res, err := store.Reserve(ctx, &budget.Reservation{Requests: reqs, Tokens: budget.WithAmount(toks, float64(amount))})
			Expect(err).NotTo(HaveOccurred())
			return res
		}

		It("takes the amount from every bucket when all of them cover it", func() {
			g, k := minute(budget.Global, "", 6000), minute(budget.APIKey, "a", 1200)
			res := reserve(1000, nil, g, k)
			Expect(res.Admitted).To(BeTrue())
			Expect(res.TokenLevels).To(Equal([]float64{5000, 200}))
			Expect(level(g)).To(near(g, 5000))
			Expect(level(k)).To(near(k, 200))
		})

		It("takes nothing from any bucket when one cannot cover the request", func() {
			g, k := minute(budget.Global, "", 6000), minute(budget.APIKey, "a", 1200)
			Expect(reserve(1000, nil, g, k).Admitted).To(BeTrue())
			res := reserve(500, nil, g, k)
			Expect(res.Admitted).To(BeFalse())
			Expect(res.RefusedBy).To(Equal(budget.TokensMinute))
			Expect(res.Refused).To(Equal(1))
			Expect(level(g)).To(near(g, 5000), "the global budget must not be drained by a refusal on api_key")
		})

		It("never drains the day budget on a minute refusal", func() {
			m, d := minute(budget.APIKey, "a", 600), day(budget.APIKey, "a", 100000)
			Expect(reserve(600, nil, m, d).Admitted).To(BeTrue())
			res := reserve(100, nil, m, d)
			Expect(res.Admitted).To(BeFalse())
			Expect(res.RefusedBy).To(Equal(budget.TokensMinute))
			Expect(level(d)).To(near(d, 99400))
		})

		It("refills continuously at the rate, up to the capacity", func() {
			// 200 tokens a second: whole again half a second after it is drained.
			m := charge(budget.TokensMinute, budget.Global, "", 100, 200)
			Expect(reserve(100, nil, m).Admitted).To(BeTrue())
			elapse(150 * time.Millisecond)
			// At most what the time so far refilled; on a store with its own clock, allow
			// the next call a tenth of a second to reach it.
			bound := elapsed()
			if f.OwnClock {
				bound += 100 * time.Millisecond
			}
			Expect(reserve(int64(math.Floor(m.Rate*bound.Seconds()))+1, nil, m).Admitted).To(BeFalse(), "no more than the rate refilled")
			Expect(reserve(30, nil, m).Admitted).To(BeTrue(), "150 milliseconds refilled 30 tokens")
			elapse(600 * time.Millisecond)
			Expect(level(m)).To(BeNumerically("~", 100, 1e-9), "never above the capacity")
		})

		It("refuses a request larger than the whole bucket at once, with a size-aware Retry-After", func() {
			m := minute(budget.Global, "", 600)
			res := reserve(1200, nil, m)
			Expect(res.Admitted).To(BeFalse())
			Expect(res.RetryAfter).To(BeNumerically("~", 120*time.Second, time.Millisecond), "the time to refill the request's own cost")
			Expect(level(m)).To(near(m, 600))
		})

		It("reports Retry-After as the time until the bucket holds the request", func() {
			m := minute(budget.Global, "", 600)
			Expect(reserve(500, nil, m).Admitted).To(BeTrue())
			res := reserve(300, nil, m) // 100 left, 200 missing at 10/s
			Expect(res.Admitted).To(BeFalse())
			Expect(res.RetryAfter).To(nearWait(20 * time.Second))
		})

		It("gives the longest wait of every bucket that refuses", func() {
			a, b := minute(budget.Global, "", 600), minute(budget.Team, "t", 60)
			Expect(reserve(60, nil, a, b).Admitted).To(BeTrue())
			res := reserve(60, nil, a, b) // a has room, b needs 60 tokens at 1/s
			Expect(res.Admitted).To(BeFalse())
			Expect(res.RetryAfter).To(nearWait(60 * time.Second))
		})

		It("refuses every positive reservation on a zero allowance", func() {
			z := charge(budget.TokensMinute, budget.Global, "", 0, 0)
			res := reserve(1, nil, z)
			Expect(res.Admitted).To(BeFalse())
			Expect(res.RetryAfter).To(Equal(time.Minute))
		})

		It("saturates a Retry-After too long to express instead of wrapping", func() {
			m := charge(budget.TokensDay, budget.Global, "", 1000, 1e-9)
			res := reserve(math.MaxInt64/4, nil, m)
			Expect(res.Admitted).To(BeFalse())
			Expect(res.RetryAfter).To(Equal(budget.MaxDuration))
			Expect(reserve(1000, nil, m).Admitted).To(BeTrue())
			res = reserve(999, nil, m)
			Expect(res.Admitted).To(BeFalse())
			Expect(res.RetryAfter).To(Equal(budget.MaxDuration))
		})

		It("takes nothing when a request-count bucket refuses, and the request only when a token bucket refuses", func() {
			r := requests(budget.APIKey, "a", 1, 2)
			m := minute(budget.APIKey, "a", 600)
			Expect(reserve(600, []budget.Charge{r}, m).Admitted).To(BeTrue())
			res := reserve(10, []budget.Charge{r}, m)
			Expect(res.Admitted).To(BeFalse())
			Expect(res.RefusedBy).To(Equal(budget.TokensMinute))
			Expect(level(r)).To(near(r, 0), "the request-count bucket admitted the request before the token check")
			res = reserve(10, []budget.Charge{r}, m)
			Expect(res.Admitted).To(BeFalse())
			Expect(res.RefusedBy).To(Equal(budget.Requests))
			Expect(res.RetryAfter).To(nearWait(time.Second))
			Expect(level(m)).To(near(m, 0))
		})

		It("takes, refunds and charges each bucket's own amount, and never takes from a warn bucket that cannot cover it", func() {
			input := rule(budget.APIKey, "k", "in", 1000)
			output := rule(budget.APIKey, "k", "out", 500)
			watch := rule(budget.Global, "", "watch", 900)
			watch.Warn = true
			in, out, w := input, output, watch
			in.Amount, out.Amount, w.Amount = 700, 400, 800
			res, err := store.Reserve(ctx, &budget.Reservation{Tokens: []budget.Charge{in, out, w}})
			Expect(err).NotTo(HaveOccurred())
			Expect(res.Admitted).To(BeTrue())
			Expect(res.TokenWarned).To(Or(BeNil(), Equal([]bool{false, false, false})))
			Expect(level(input)).To(near(input, 300))
			Expect(level(output)).To(near(output, 100))
			Expect(level(watch)).To(near(watch, 100))

			in.Amount, out.Amount, w.Amount = 200, 50, 200
			res, err = store.Reserve(ctx, &budget.Reservation{Tokens: []budget.Charge{in, out, w}})
			Expect(err).NotTo(HaveOccurred())
			Expect(res.Admitted).To(BeTrue(), "a warn bucket never refuses")
			Expect(res.TokenWarned).To(Equal([]bool{false, false, true}))
			Expect(level(watch)).To(near(watch, 100), "and takes nothing when the request does not fit")
			Expect(level(input)).To(near(input, 100))

			in.Amount, out.Amount = 150, 10
			res, err = store.Reserve(ctx, &budget.Reservation{Tokens: []budget.Charge{in, out}})
			Expect(err).NotTo(HaveOccurred())
			Expect(res.Admitted).To(BeFalse())
			Expect(res.Refused).To(Equal(0), "the input bucket cannot give its 150")
			Expect(level(output)).To(near(output, 50), "nothing was taken")

			in.Amount, out.Amount = 100, 300
			store.Refund(ctx, []budget.Charge{in, out})
			Expect(level(input)).To(near(input, 200))
			Expect(level(output)).To(near(output, 350))
			in.Amount, out.Amount = 250, 10
			taken, debt, levels := store.Charge(ctx, []budget.Charge{in, out}, budget.Debt)
			Expect(taken).To(HaveExactElements(near(input, 250), near(output, 10)))
			Expect(debt).To(HaveExactElements(near(input, 50), BeZero()), "the input bucket took on 50 of debt")
			Expect(levels).To(HaveExactElements(near(input, -50), near(output, 340)), "each bucket's level after the charge")
			Expect(level(input)).To(near(input, -50))
			Expect(level(output)).To(near(output, 340))
		})

		It("refunds up to the capacity and no further", func() {
			m := minute(budget.Global, "", 600)
			Expect(reserve(100, nil, m).Admitted).To(BeTrue())
			store.Refund(ctx, budget.WithAmount([]budget.Charge{m}, 60))
			Expect(level(m)).To(near(m, 560))
			store.Refund(ctx, budget.WithAmount([]budget.Charge{m}, 1000))
			Expect(level(m)).To(BeNumerically("~", 600, 1e-9))
		})

		Describe("an overage the bucket cannot cover", func() {
			It("goes into debt on every bucket that cannot cover it, each at most one capacity below zero", func() {
				a, b := minute(budget.Global, "", 6000), minute(budget.APIKey, "k", 600)
				Expect(reserve(550, nil, a, b).Admitted).To(BeTrue())
				taken, debt, levels := store.Charge(ctx, budget.WithAmount([]budget.Charge{a, b}, 100), budget.Debt)
				Expect(taken).To(HaveExactElements(near(a, 100), near(b, 100)), "every bucket took the whole overage")
				Expect(levels).To(HaveExactElements(near(a, 5350), near(b, -50)))
				Expect(debt).To(HaveExactElements(BeZero(), near(b, 50)), "the key's bucket covered 50 and owes the rest")
				Expect(level(a)).To(near(a, 5350))
				Expect(level(b)).To(near(b, -50), "the tenant owes 50 tokens")

				taken, debt, levels = store.Charge(ctx, budget.WithAmount([]budget.Charge{a, b}, 1000), budget.Debt)
				Expect(levels).To(HaveExactElements(near(a, 4350), near(b, -600)))
				Expect(taken[0]).To(near(a, 1000))
				Expect(taken[1]).To(near(b, 550), "only down to one capacity below zero")
				Expect(debt).To(HaveExactElements(BeZero(), near(b, 550)), "a bucket already in debt owes all it takes")
				Expect(level(b)).To(near(b, -600))
				Expect(level(b)).To(BeNumerically(">=", -600), "never below minus the capacity")
			})

			It("refuses while the bucket is in debt, with a Retry-After that includes the debt", func() {
				m := minute(budget.APIKey, "k", 600) // 10 tokens a second
				Expect(reserve(600, nil, m).Admitted).To(BeTrue())
				store.Charge(ctx, budget.WithAmount([]budget.Charge{m}, 600), budget.Debt)
				res := reserve(100, nil, m)
				Expect(res.Admitted).To(BeFalse())
				Expect(res.TokenLevels[0]).To(near(m, -600))
				Expect(res.RetryAfter).To(nearWait(70*time.Second), "600 owed and 100 asked, at 10 a second")
				res = reserve(1200, nil, m)
				Expect(res.Admitted).To(BeFalse())
				Expect(res.RetryAfter).To(nearWait(180*time.Second), "larger than the bucket: the debt, then the request's own cost")
			})

			It("admits again once the tenant has waited out the Retry-After", func() {
				m := charge(budget.TokensMinute, budget.APIKey, "k", 100, 1000) // refills in a tenth of a second
				Expect(reserve(100, nil, m).Admitted).To(BeTrue())
				store.Charge(ctx, budget.WithAmount([]budget.Charge{m}, 100), budget.Debt)
				res := reserve(50, nil, m)
				Expect(res.Admitted).To(BeFalse())
				Expect(res.RetryAfter).To(nearWait(150 * time.Millisecond))
				elapse(res.RetryAfter)
				Expect(reserve(50, nil, m).Admitted).To(BeTrue(), "the debt repaid, and the request's own 50 refilled")
			})

			It("keeps its negative fraction when a reload rebuilds the bucket, never granting budget", func() {
				old := minute(budget.Global, "", 600)
				Expect(reserve(600, nil, old).Admitted).To(BeTrue())
				store.Charge(ctx, budget.WithAmount([]budget.Charge{old}, 300), budget.Debt) // -300 of 600: minus a half
				halved := minute(budget.Global, "", 300)
				res := reserve(1, nil, halved)
				Expect(res.Admitted).To(BeFalse())
				Expect(res.TokenLevels[0]).To(near(halved, -150), "minus a half of 300")
				Expect(res.RetryAfter).To(nearWait(30200*time.Millisecond), "151 tokens at 5 a second")
			})

			It("consumes nothing under overage: forgive", func() {
				a, b := minute(budget.Global, "", 6000), minute(budget.APIKey, "k", 600)
				Expect(reserve(550, nil, a, b).Admitted).To(BeTrue())
				taken, debt, levels := store.Charge(ctx, budget.WithAmount([]budget.Charge{a, b}, 100), budget.Forgive)
				Expect(taken).To(HaveExactElements(near(a, 100), BeZero()))
				Expect(levels).To(HaveExactElements(near(a, 5350), near(b, 50)))
				Expect(debt).To(HaveExactElements(BeZero(), BeZero()), "forgiven, not owed")
				Expect(level(a)).To(near(a, 5350))
				Expect(level(b)).To(near(b, 50), "an overage the bucket cannot cover consumes nothing")
			})
		})

		It("keeps the fraction drawn down when a bucket's capacity changes", func() {
			old := minute(budget.Global, "", 600)
			Expect(reserve(450, nil, old).Admitted).To(BeTrue()) // 25% left
			halved := minute(budget.Global, "", 300)
			res := reserve(1, nil, halved)
			Expect(res.Admitted).To(BeTrue())
			Expect(level(halved)).To(near(halved, 74))
		})

		It("settles a hold on the parameters it recorded after the capacity changed", func() {
			old := minute(budget.Global, "", 600)
			Expect(reserve(600, nil, old).Admitted).To(BeTrue())
			halved := minute(budget.Global, "", 300)
			Expect(reserve(0, nil, halved).Admitted).To(BeTrue())           // rebuilt at 0 of 300
			store.Refund(ctx, budget.WithAmount([]budget.Charge{old}, 600)) // the whole old hold back
			Expect(level(halved)).To(BeNumerically("~", 300, 0.01))
		})

		if f.Prunes {
			It("drops buckets that a reload no longer configures", func() {
				a, b := minute(budget.APIKey, "gone", 600), minute(budget.APIKey, "kept", 600)
				Expect(reserve(100, nil, a, b).Admitted).To(BeTrue())
				store.Prune(func(k budget.Key) bool { return k.ID == "kept" })
				_, ok := f.Level(store, a.Key)
				Expect(ok).To(BeFalse())
				Expect(level(b)).To(near(b, 500))
			})
		}

		if f.Bounded {
			It("admits without charge when a dimension's bucket map is full, and only on that dimension", func() {
				small := f.New(clock, 2)
				DeferCleanup(small.Close)
				for _, id := range []string{"a", "b"} {
					res, err := small.Reserve(ctx, &budget.Reservation{Tokens: budget.WithAmount([]budget.Charge{minute(budget.Client, id, 600)}, 600)})
					Expect(err).NotTo(HaveOccurred())
					Expect(res.Admitted).To(BeTrue())
				}
				// The client minute map is full. A new client fails open there, while its
				// day bucket, and a key's buckets, live in maps of their own.
				key := minute(budget.APIKey, "alice", 600)
				res, err := small.Reserve(ctx, &budget.Reservation{Tokens: budget.WithAmount([]budget.Charge{
					minute(budget.Client, "c", 600), day(budget.Client, "c", 86400), key}, 600)})
				Expect(err).NotTo(HaveOccurred())
				Expect(res.Admitted).To(BeTrue())
				Expect(res.TokenSkipped).To(Equal([]bool{true, false, false}))
				res, err = small.Reserve(ctx, &budget.Reservation{Tokens: budget.WithAmount([]budget.Charge{key}, 1)})
				Expect(err).NotTo(HaveOccurred())
				Expect(res.Admitted).To(BeFalse(), "the key's budget is still enforced: a flood of clients never opens it")
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
					res, err := store.Reserve(ctx, &budget.Reservation{Tokens: budget.WithAmount([]budget.Charge{m}, 100)})
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

		// bound asks the store to bound one client-supplied value of rule's window 0
		// under key, in the epoch start, at limit distinct values; it reports Over.
		bound := func(rule, key, value string, start, limit int64) bool {
			GinkgoHelper()
			vb, ok := store.(budget.ValueBounder)
			Expect(ok).To(BeTrue(), "the store bounds client-supplied values where its counters live")
			asks := []budget.ValueAsk{{Rule: rule, Key: key, Value: value, Limit: limit, Start: start, TTL: time.Minute}}
			Expect(vb.BoundValues(ctx, asks)).To(Succeed())
			return asks[0].Over
		}

		It("bounds the distinct client-supplied values of a rule window per key and epoch", func() {
			for _, v := range []string{"s-1", "s-2", "s-3"} {
				Expect(bound("each-session", "alice", v, 1, 3)).To(BeFalse(), v)
			}
			Expect(bound("each-session", "alice", "s-4", 1, 3)).To(BeTrue(), "a fourth value is beyond the bound of 3")
			Expect(bound("each-session", "alice", "s-5", 1, 3)).To(BeTrue())
			Expect(bound("each-session", "alice", "s-2", 1, 3)).To(BeFalse(), "a value the set holds is still its own")
			Expect(bound("each-session", "bob", "s-4", 1, 3)).To(BeFalse(), "another key's values are bounded apart")
			Expect(bound("each-task", "alice", "s-4", 1, 3)).To(BeFalse(), "another rule's too")
			Expect(bound("each-session", "alice", "s-4", 2, 3)).To(BeFalse(), "the next window starts with no values")
		})

		It("tells, adding nothing, which values a bound would count in the overflow subject", func() {
			vp, ok := store.(budget.ValuePeeker)
			Expect(ok).To(BeTrue(), "explain reads the bound where its counters live")
			peek := func(value string) bool {
				asks := []budget.ValueAsk{{Rule: "peeked", Key: "alice", Value: value, Limit: 2, Start: 1, TTL: time.Minute}}
				Expect(vp.PeekValues(ctx, asks)).To(Succeed())
				return asks[0].Over
			}
			Expect(peek("s-1")).To(BeFalse(), "an empty set admits a value")
			Expect(bound("peeked", "alice", "s-1", 1, 2)).To(BeFalse())
			Expect(peek("s-2")).To(BeFalse())
			Expect(peek("s-3")).To(BeFalse(), "peeking s-2 added nothing")
			Expect(bound("peeked", "alice", "s-2", 1, 2)).To(BeFalse())
			Expect(peek("s-3")).To(BeTrue(), "the set holds its limit")
			Expect(peek("s-1")).To(BeFalse(), "a value it holds is its own")
		})

		It("never holds more values than the bound under concurrent asks", func() {
			var wg sync.WaitGroup
			var mu sync.Mutex
			held := 0
			for i := range 50 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					defer GinkgoRecover()
					if !bound("racing", "alice", fmt.Sprintf("s-%d", i), 1, 10) {
						mu.Lock()
						held++
						mu.Unlock()
					}
				}()
			}
			wg.Wait()
			Expect(held).To(Equal(10))
		})
	})
	return true
}
