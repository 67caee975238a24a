// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package budget_test

import (
	"context"
	"math"
	"strconv"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/proxy/budget/storetest"
	"github.com/tokenwarden/tokenwarden/proxy/config"
)

// tally is a Recorder that keeps what it is told.
type tally struct {
	budget.NopRecorder
	mu      sync.Mutex
	period  map[string]float64 // "dimension/period/outcome"
	dim     map[string]float64 // "dimension/outcome"
	key     map[string]float64 // "key/outcome"
	skipped map[string]int
	full    map[string]int // "dimension/kind"
}

func newTally() *tally {
	return &tally{period: map[string]float64{}, dim: map[string]float64{}, key: map[string]float64{}, skipped: map[string]int{}, full: map[string]int{}}
}

func (t *tally) PeriodTokens(d budget.Dimension, k budget.Kind, o budget.Outcome, n float64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.period[d.String()+"/"+k.String()+"/"+o.String()] += n
}

func (t *tally) DimensionTokens(d budget.Dimension, o budget.Outcome, n float64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.dim[d.String()+"/"+o.String()] += n
}

func (t *tally) KeyTokens(key string, o budget.Outcome, n float64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.key[key+"/"+o.String()] += n
}

func (t *tally) Skipped(label string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.skipped[label]++
}

func (t *tally) BucketMapFull(d budget.Dimension, k budget.Kind) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.full[d.String()+"/"+k.String()]++
}

func policy(rateLimiting string) *budget.Policy {
	c, err := config.Parse([]byte(`
upstreams: [{name: default, url: "http://127.0.0.1:1"}]
api_keys: [{name: alice, key_sha256: "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"}]
rate_limiting:
  budget_division: {replicas: 1}
` + rateLimiting))
	Expect(err).NotTo(HaveOccurred())
	return budget.NewPolicy(c)
}

var _ = Describe("The limiter", func() {
	ctx := context.Background()

	DescribeTable("counts an overage as charged on every bucket that took it, and only what it took",
		func(overage string, global, key float64) {
			p := policy(`  overage: ` + overage + `
  limits:
    global: {tokens_per_minute: 60000}
    per_api_key: {tokens_per_minute: 600, tokens_per_day: 1000}
`)
			rec := newTally()
			clock := storetest.NewClock()
			l := budget.NewLimiter(budget.NewMemory(clock, 100), rec, clock, false)
			dec, err := l.Admit(ctx, p, budget.Identity{Key: p.Key("alice")}, budget.Ask{Input: 500})
			Expect(err).NotTo(HaveOccurred())
			Expect(dec.Hold).NotTo(BeNil())
			// 500 reserved, 1,400 used: 900 more, which global holds, the key's minute
			// bucket (100 left) only as a debt bounded at -600 (700), and its day bucket
			// (500 left) as a debt of 400.
			Expect(dec.Hold.Settle(budget.Used{Input: 1400})).To(BeTrue())
			Expect(rec.period["global/minute/charged"]).To(Equal(global))
			Expect(rec.period["api_key/minute/charged"]).To(Equal(key))
			Expect(rec.period["api_key/day/charged"]).To(Equal(key * 900 / 700))
			Expect(rec.dim["api_key/charged"]).To(Equal(key*900/700), "once per dimension: the most one of its periods took")
			Expect(rec.key["alice/charged"]).To(Equal(global), "the most any bucket took")
		},
		Entry("debt", "debt", 900.0, 700.0),
		Entry("forgive", "forgive", 900.0, 0.0),
	)

	DescribeTable("names a bucket smaller than the whole request, which no wait can cure",
		func(limits string, amount int64, larger bool, dim budget.Dimension, period budget.Kind) {
			p := policy("  limits:\n" + limits)
			clock := storetest.NewClock()
			l := budget.NewLimiter(budget.NewMemory(clock, 100), newTally(), clock, false)
			// 550 tokens are spent first, where they fit.
			if dec, err := l.Admit(ctx, p, budget.Identity{Key: p.Key("alice")}, budget.Ask{Input: 550}); err == nil && dec.Hold != nil {
				dec.Hold.Settle(budget.Used{Input: 550})
			}
			dec, err := l.Admit(ctx, p, budget.Identity{Key: p.Key("alice")}, budget.Ask{Input: amount})
			Expect(err).NotTo(HaveOccurred())
			Expect(dec.Refusal).NotTo(BeNil())
			Expect(dec.Refusal.LargerThanBucket).To(Equal(larger))
			Expect(dec.Refusal.Dimension).To(Equal(dim))
			Expect(dec.Refusal.Period).To(Equal(period))
		},
		Entry("a request that fits the bucket once it refills", "    per_api_key: {tokens_per_minute: 600}\n", int64(100), false, budget.APIKey, budget.TokensMinute),
		Entry("a request larger than the key's whole minute budget", "    per_api_key: {tokens_per_minute: 600}\n", int64(601), true, budget.APIKey, budget.TokensMinute),
		Entry("a request larger than the key's budget while a shared budget refused first",
			"    global: {tokens_per_minute: 1000}\n    per_api_key: {tokens_per_minute: 600}\n", int64(601), true, budget.APIKey, budget.TokensMinute),
		Entry("a request larger than a shared budget", "    global: {tokens_per_minute: 500}\n", int64(501), true, budget.Global, budget.TokensMinute),
		Entry("a request larger than the day budget though the minute budget would hold it",
			"    per_api_key: {tokens_per_minute: 6000, tokens_per_day: 700}\n", int64(701), true, budget.APIKey, budget.TokensDay),
	)

	It("reports a key bucket in debt with nothing remaining and its reset after the debt is repaid", func() {
		p := policy(`
  limits:
    per_api_key: {tokens_per_minute: 600}
`)
		clock := storetest.NewClock()
		l := budget.NewLimiter(budget.NewMemory(clock, 100), newTally(), clock, false)
		dec, err := l.Admit(ctx, p, budget.Identity{Key: p.Key("alice")}, budget.Ask{Input: 600})
		Expect(err).NotTo(HaveOccurred())
		dec.Hold.Settle(budget.Used{Input: 900}) // 300 owed
		dec, err = l.Admit(ctx, p, budget.Identity{Key: p.Key("alice")}, budget.Ask{Input: 100})
		Expect(err).NotTo(HaveOccurred())
		Expect(dec.Refusal).NotTo(BeNil())
		Expect(dec.Refusal.RetryAfter).To(Equal(40 * time.Second))
		Expect(dec.Refusal.Bucket.Remaining).To(BeZero())
		Expect(dec.Refusal.Bucket.Reset).To(Equal(clock.Now().Add(90*time.Second)), "300 owed and 600 to refill at 10 a second")
	})

	It("saturates the header numbers of a budget too large for an int64 instead of wrapping", func() {
		p := policy(`
  limits:
    per_api_key: {tokens_per_minute: ` + strconv.FormatInt(math.MaxInt64, 10) + `}
`)
		clock := storetest.NewClock()
		l := budget.NewLimiter(budget.NewMemory(clock, 100), newTally(), clock, false)
		dec, err := l.Admit(ctx, p, budget.Identity{Key: p.Key("alice")}, budget.Ask{Input: math.MaxInt64 / 4})
		Expect(err).NotTo(HaveOccurred())
		Expect(dec.Refusal).To(BeNil())
		Expect(dec.KeyMinute.Limit).To(Equal(int64(math.MaxInt64)))
		Expect(dec.KeyMinute.Remaining).To(BeNumerically(">", 0))
		Expect(dec.KeyMinute.Reset).To(BeTemporally(">", clock.Now()))
		Expect(dec.Hold.Settle(budget.Used{Input: math.MaxInt64})).To(BeTrue(), "an absurd usage settles without wrapping")
		dec, err = l.Admit(ctx, p, budget.Identity{Key: p.Key("alice")}, budget.Ask{Input: math.MaxInt64 / 4})
		Expect(err).NotTo(HaveOccurred())
		Expect(dec.Refusal).NotTo(BeNil(), "the budget is spent")
		Expect(dec.Refusal.RetryAfter).To(BeNumerically(">", 0))
		Expect(dec.Refusal.Bucket.Remaining).To(BeZero())
		Expect(dec.Refusal.Bucket.Reset).To(BeTemporally(">", clock.Now()))
	})

	It("counts what a full map admitted without charge, by dimension and kind", func() {
		p := policy(`
  limits:
    per_client: {requests_per_second: 10, tokens_per_minute: 600, tokens_per_day: 6000}
    per_api_key: {tokens_per_minute: 600}
`)
		rec := newTally()
		clock := storetest.NewClock()
		l := budget.NewLimiter(budget.NewMemory(clock, 1), rec, clock, false)
		for _, client := range []string{"192.0.2.1", "192.0.2.2"} {
			dec, err := l.Admit(ctx, p, budget.Identity{Key: p.Key("alice"), Client: client}, budget.Ask{Input: 100})
			Expect(err).NotTo(HaveOccurred())
			Expect(dec.Refusal).To(BeNil())
		}
		Expect(rec.skipped).To(Equal(map[string]int{"request_rate": 1, "token_budget": 1, "token_budget_day": 1}))
		Expect(rec.full).To(Equal(map[string]int{"client/requests": 1, "client/minute": 1, "client/day": 1}), "the key's map is not full")
	})
})
