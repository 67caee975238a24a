// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package redisstore_test

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/proxy/budget/redisstore"
	"github.com/tokenwarden/tokenwarden/test/redisserver"
)

// spendFallback is a durable fallback that admits every durable charge and keeps
// what it admitted per counter, as the ledger fallback does within its share.
type spendFallback struct {
	mu    sync.Mutex
	gen   uint64
	spent map[budget.Key]budget.Charge
}

func (f *spendFallback) Answers(*budget.Charge) bool { return true }

func (f *spendFallback) Reserve(_ context.Context, charges []budget.Charge) (redisstore.FallbackDecision, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, ch := range charges {
		c, ok := f.spent[ch.Key]
		if !ok {
			c = ch
			c.Amount = 0
		}
		c.Amount += ch.Amount
		f.spent[ch.Key] = c
	}
	return redisstore.FallbackDecision{Admitted: true, Levels: make([]float64, len(charges)), Gen: f.gen}, nil
}

func (f *spendFallback) Refund(uint64, []budget.Charge) bool { return true }
func (f *spendFallback) Charge(uint64, []budget.Charge) bool { return true }

func (f *spendFallback) Drain() []budget.Charge {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []budget.Charge
	for _, c := range f.spent {
		out = append(out, c)
	}
	f.gen++
	f.spent = map[budget.Key]budget.Charge{}
	return out
}

var _ = Describe("The ledger fallback's spend charged to Redis when it answers again", func() {
	var (
		ctx   context.Context
		rs    *redisserver.Server
		store *redisstore.Store
		calls atomic.Int64
	)
	month := func(amount float64) *budget.Reservation {
		return &budget.Reservation{Tokens: []budget.Charge{{Key: budget.Key{Kind: budget.Calendar, Dim: budget.APIKey, ID: "alice", Rule: "key-dollars", Start: 1},
			SharedCapacity: 100, Amount: amount, EndMillis: time.Now().Add(time.Hour).UnixMilli(), Durable: true}}}
	}
	// spent is what alice's counter holds spent.
	spent := func() float64 {
		total := 0.0
		Expect(store.EachLevel(ctx, func(k budget.Key, level, capacity float64) {
			if k.Rule == "key-dollars" && k.ID == "alice" {
				total += capacity - level
			}
		})).To(Succeed())
		return total
	}
	// admit reserves amount and adds it to admitted when it is admitted; it reports
	// whether Redis decided it.
	var admitted float64
	admit := func(amount float64) bool {
		GinkgoHelper()
		res, err := store.Reserve(ctx, month(amount))
		Expect(err).NotTo(HaveOccurred())
		Expect(res.Admitted).To(BeTrue())
		admitted += amount
		return res.Shared
	}
	// outage admits 1 on Redis, then 0.25 that finds it paused (it reaches Redis when
	// it resumes, as a call that timed out may: counted high, never low), 2 and 3 on
	// the fallback; then Redis resumes, and the store calls before ahead of each call
	// of the replay that the next admission on Redis starts.
	outage := func(before func()) {
		Expect(admit(1)).To(BeTrue(), "the epoch is created")
		Expect(rs.Pause()).To(Succeed())
		Expect(admit(0.25)).To(BeFalse())
		Expect(admit(2)).To(BeFalse())
		Expect(admit(3)).To(BeFalse())
		store.BeforeReplay(func() {
			calls.Add(1)
			before()
		})
		Expect(rs.Resume()).To(Succeed())
		Eventually(func() bool { return admit(4) }).WithTimeout(10 * time.Second).WithPolling(200 * time.Millisecond).Should(BeTrue())
	}
	// expectCharged checks that alice's counter holds what was admitted, the call
	// that found Redis paused at most counted twice.
	expectCharged := func(why string) {
		GinkgoHelper()
		Eventually(spent).WithTimeout(10*time.Second).Should(BeNumerically(">=", admitted-1e-9), why)
		Consistently(spent).WithTimeout(2*time.Second).Should(And(BeNumerically(">=", admitted-1e-9), BeNumerically("<=", admitted+0.25+1e-9)), why)
	}

	BeforeEach(func() {
		ctx = context.Background()
		calls.Store(0)
		admitted = 0
		rs = redisserver.Start(GinkgoT())
		var err error
		store, err = redisstore.New(redisstore.Options{URL: rs.URL(), Prefix: "replay", DialTimeout: 500 * time.Millisecond,
			ReadTimeout: 500 * time.Millisecond, WriteTimeout: 500 * time.Millisecond,
			Logger: slog.New(slog.NewTextHandler(GinkgoWriter, nil))})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(store.Close)
		store.SetDurableFallback(&spendFallback{spent: map[budget.Key]budget.Charge{}})
	})

	It("retries a replay Redis refused until it lands", func() {
		admin := rs.Client()
		DeferCleanup(admin.Close)
		outage(func() {
			// Out of memory at the first call: Redis refuses a script that may write.
			limit := "1"
			if calls.Load() > 1 {
				limit = "0"
			}
			_ = admin.ConfigSet(ctx, "maxmemory", limit).Err()
		})
		expectCharged("the outage's spend is charged")
		Expect(calls.Load()).To(BeNumerically(">=", 2), "the first replay was refused, and sent again")
	})

	It("charges a replay whose answer was lost once, not twice", func() {
		var resumed sync.WaitGroup
		DeferCleanup(resumed.Wait)
		outage(func() {
			if calls.Load() > 1 {
				return
			}
			// The first call reaches a Redis that answers after the client gave up:
			// it is applied, and its answer lost.
			_ = rs.Pause()
			resumed.Go(func() {
				time.Sleep(time.Second)
				_ = rs.Resume()
			})
		})
		Eventually(calls.Load).WithTimeout(10*time.Second).Should(BeNumerically(">=", 2), "the replay is sent again")
		resumed.Wait()
		expectCharged("charged once")
	})
})
