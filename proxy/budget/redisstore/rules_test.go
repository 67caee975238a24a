// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/proxy/budget/redisstore"
	"github.com/tokenwarden/tokenwarden/proxy/budget/storetest"
	"github.com/tokenwarden/tokenwarden/proxy/config"
	"github.com/tokenwarden/tokenwarden/proxy/metrics"
)

// redisPolicy is a document on Redis with keys alice and bob, gpt-4o priced at $0
// input ($0 cached) and $250 a million output tokens (a thousand output tokens cost
// exactly a quarter), and the rules given.
func redisPolicy(rules string) *budget.Policy {
	GinkgoHelper()
	c, err := config.Parse([]byte(`
upstreams: [{name: default, url: "http://127.0.0.1:1"}]
models:
- {name: gpt-4o, price: {input: 0, output: 250}}
api_keys:
- {name: alice, key_sha256: "0000000000000000000000000000000000000000000000000000000000000001"}
- {name: bob, key_sha256: "0000000000000000000000000000000000000000000000000000000000000002"}
rate_limiting:
  storage: redis
  redis: {url: "` + srv.URL() + `"}
  rules:
` + rules))
	Expect(err).NotTo(HaveOccurred())
	return budget.NewPolicy(c)
}

func admit(l *budget.Limiter, p *budget.Policy, key, model string, in, out int64) budget.Decision {
	GinkgoHelper()
	dec, err := l.Admit(context.Background(), p, budget.Identity{Key: p.Key(key), Model: model}, budget.Ask{Input: in, Output: out})
	Expect(err).NotTo(HaveOccurred())
	return dec
}

var _ = Describe("Rules in Redis", func() {
	var (
		s *redisstore.Store
		l *budget.Limiter
	)
	BeforeEach(func() {
		s = newStore(storetest.NewClock(), nil, nil)
		DeferCleanup(s.Close)
		l = budget.NewLimiter(s, budget.NopRecorder{}, budget.SystemClock{}, false)
	})
	level := func(k budget.Key) float64 {
		GinkgoHelper()
		v, ok, err := s.Level(context.Background(), k)
		Expect(err).NotTo(HaveOccurred())
		Expect(ok).To(BeTrue(), "the counter exists")
		return v
	}

	It("reserves and settles each amount on its own counter, and never takes from a warn rule that does not fit", func() {
		p := redisPolicy(`
  - {name: in, dimension: api_key, amount: input_tokens, windows: [{limit: 1000, rolling: {period: hour}}]}
  - {name: out, dimension: api_key, amount: output_tokens, windows: [{limit: 500, rolling: {period: hour}}]}
  - {name: watch, dimension: global, action: warn, windows: [{limit: 1200, rolling: {period: hour}}]}
`)
		in := budget.Key{Kind: budget.Rolling, Dim: budget.APIKey, ID: "alice", Rule: "in"}
		out := budget.Key{Kind: budget.Rolling, Dim: budget.APIKey, ID: "alice", Rule: "out"}
		watch := budget.Key{Kind: budget.Rolling, Dim: budget.Global, Rule: "watch"}
		dec := admit(l, p, "alice", "", 700, 400)
		Expect(dec.Refusal).To(BeNil())
		Expect(dec.Warnings).To(BeEmpty())
		Expect(level(in)).To(BeNumerically("~", 300, 1))
		Expect(level(out)).To(BeNumerically("~", 100, 1))
		Expect(level(watch)).To(BeNumerically("~", 100, 1))
		dec.Hold.Settle(budget.Used{Input: 700, Output: 50})
		Expect(level(in)).To(BeNumerically("~", 300, 1), "the input was as estimated")
		Expect(level(out)).To(BeNumerically("~", 450, 1), "350 unused output tokens come back")
		Expect(level(watch)).To(BeNumerically("~", 450, 1))

		dec = admit(l, p, "alice", "", 200, 400)
		Expect(dec.Refusal).To(BeNil(), "warn never refuses")
		Expect(dec.Warnings).To(Equal([]budget.Warning{{Rule: "watch", Window: "hour"}}))
		Expect(level(watch)).To(BeNumerically("~", 450, 1), "the warned request took nothing")
		Expect(level(in)).To(BeNumerically("~", 100, 1))
		Expect(dec.KeyInput.Remaining).To(BeNumerically("~", 100, 1), "the key's own counter, in the headers")

		refused := admit(l, p, "alice", "", 101, 1)
		Expect(refused.Refusal).NotTo(BeNil())
		Expect(refused.Refusal.Rule).To(Equal("in"))
		Expect(refused.Refusal.RetryAfter).To(BeNumerically("~", 3600*time.Millisecond, 100*time.Millisecond), "1 token at 1,000 an hour")
	})

	It("refuses a cost budget at the dollar, and settles dollars on the reported usage", func() {
		p := redisPolicy(`
  - {name: alice-gpt4o-monthly, dimension: api_key, subjects: [alice], models: [gpt-4o], amount: cost, windows: [{limit: 1, calendar: {every: month}}]}
`)
		for range 3 {
			dec := admit(l, p, "alice", "gpt-4o", 100, 1000) // $0.25 each
			Expect(dec.Refusal).To(BeNil())
			Expect(dec.Hold.Settle(budget.Used{Input: 100, Output: 1000})).To(BeTrue())
		}
		dec := admit(l, p, "alice", "gpt-4o", 100, 1000)
		Expect(dec.Refusal).To(BeNil(), "the fourth quarter is the last one")
		Expect(dec.KeyCost.Present).To(BeTrue())
		Expect(dec.KeyCost.Limit).To(Equal(1.0))
		Expect(dec.KeyCost.Remaining).To(Equal(0.0))
		dec.Hold.Settle(budget.Used{Input: 100, Output: 600}) // $0.15: $0.10 back
		dec = admit(l, p, "alice", "gpt-4o", 100, 1000)
		Expect(dec.Refusal).NotTo(BeNil(), "a quarter does not fit in the $0.10 left")
		Expect(dec.Refusal.Amount).To(Equal(budget.AmountCost))
		Expect(dec.Refusal.Rule).To(Equal("alice-gpt4o-monthly"))
		Expect(dec.Refusal.Cost.Remaining).To(BeNumerically("~", 0.10, 1e-9))
		start, end := (&config.Calendar{Every: config.EveryMonth}).Span(time.Now())
		Expect(start.Day()).To(Equal(1))
		Expect(dec.Refusal.RetryAfter).To(BeNumerically("~", time.Until(end), 2*time.Second), "a calendar window refills at its reset")
		Expect(admit(l, p, "alice", "gpt-4o", 100, 400).Refusal).To(BeNil(), "$0.10 still fits")
		Expect(admit(l, p, "alice", "other-model", 100, 100000).Refusal).To(BeNil(), "the rule governs gpt-4o only")
		Expect(admit(l, p, "bob", "gpt-4o", 100, 100000).Refusal).To(BeNil(), "the rule names alice only")
	})

	It("records a calendar counter's whole overage, whatever overage says", func() {
		p := redisPolicy(`
  - {name: daily, dimension: api_key, windows: [{limit: 1000, calendar: {every: day}}]}
`)
		dec := admit(l, p, "alice", "", 500, 500)
		Expect(dec.Refusal).To(BeNil())
		dec.Hold.Settle(budget.Used{Input: 500, Output: 2500}) // 2,000 beyond the 1,000 held
		start, _ := (&config.Calendar{Every: config.EveryDay}).Span(time.Now())
		Expect(level(budget.Key{Kind: budget.Calendar, Dim: budget.APIKey, ID: "alice", Rule: "daily", Start: start.Unix()})).To(Equal(-2000.0))
	})

	It("shows a calendar window's level after an overage in its gauges", func() {
		p := redisPolicy(`
  - {name: month, dimension: api_key, windows: [{limit: 10000, calendar: {every: month}}]}
`)
		m := metrics.New(prometheus.NewRegistry())
		l := budget.NewLimiter(s, m, budget.SystemClock{}, false)
		used := func() float64 { return testutil.ToFloat64(m.RuleUsed.WithLabelValues("month", "calendar_month")) }
		dec := admit(l, p, "alice", "", 500, 500)
		Expect(dec.Refusal).To(BeNil())
		Expect(used()).To(BeNumerically("~", 0.1, 1e-9), "1,000 reserved of 10,000")
		Expect(dec.Hold.Settle(budget.Used{Input: 6000, Output: 6000})).To(BeTrue())
		Expect(used()).To(BeNumerically("~", 1.2, 1e-9), "12,000 spent of 10,000: the window is 2,000 over")
		Expect(admit(l, p, "alice", "", 500, 500).Refusal).NotTo(BeNil(), "the next request is refused")
		Expect(used()).To(BeNumerically("~", 1.2, 1e-9))
	})

	It("shows each window's level after a refund sent without waiting, and after a release", func() {
		p := redisPolicy(`
  - {name: month, dimension: api_key, windows: [{limit: 10000, calendar: {every: month}}, {limit: 20000, rolling: {period: day}}]}
`)
		m := metrics.New(prometheus.NewRegistry())
		// As in the proxy: refunds go with a later pipeline and settlement does not wait.
		l := budget.NewLimiter(s, m, budget.SystemClock{}, true)
		month := func() float64 { return testutil.ToFloat64(m.RuleUsed.WithLabelValues("month", "calendar_month")) }
		day := func() float64 { return testutil.ToFloat64(m.RuleUsed.WithLabelValues("month", "day")) }
		dec := admit(l, p, "alice", "", 500, 500)
		Expect(dec.Refusal).To(BeNil())
		Expect(month()).To(BeNumerically("~", 0.1, 1e-9), "1,000 reserved of 10,000")
		Expect(day()).To(BeNumerically("~", 0.05, 1e-4), "1,000 reserved of 20,000")
		Expect(dec.Hold.Settle(budget.Used{Input: 200, Output: 200})).To(BeTrue())
		Expect(month()).To(BeNumerically("~", 0.04, 1e-9), "400 spent of 10,000")
		Expect(day()).To(BeNumerically("~", 0.02, 1e-4), "400 spent of 20,000")

		dec = admit(l, p, "alice", "", 1000, 1000)
		Expect(month()).To(BeNumerically("~", 0.24, 1e-9), "400 spent and 2,000 reserved")
		Expect(dec.Hold.Release()).To(BeTrue())
		Expect(month()).To(BeNumerically("~", 0.04, 1e-9), "400 spent")
		Expect(day()).To(BeNumerically("~", 0.02, 1e-4))

		Expect(l.Wait(context.Background())).To(Succeed())
		start, _ := (&config.Calendar{Every: config.EveryMonth}).Span(time.Now())
		Expect(level(budget.Key{Kind: budget.Calendar, Dim: budget.APIKey, ID: "alice", Rule: "month", Start: start.Unix()})).To(Equal(9600.0), "the gauge is the counter's level")
		Expect((20000 - level(budget.Key{Kind: budget.Rolling, Dim: budget.APIKey, ID: "alice", Rule: "month", Window: 1})) / 20000).To(BeNumerically("~", day(), 1e-4))
	})

	DescribeTable("starts each calendar window at zero at its wall-clock anchor",
		func(cal string, before, after time.Time) {
			p := redisPolicy(`
  - {name: cal, dimension: api_key, windows: [{limit: 1000, calendar: ` + cal + `}]}
`)
			s.ShiftCalendar(time.Until(before))
			Expect(admit(l, p, "alice", "", 900, 0).Refusal).To(BeNil())
			refused := admit(l, p, "alice", "", 200, 0)
			Expect(refused.Refusal).NotTo(BeNil(), "the window holds 100 more")
			Expect(refused.Refusal.RetryAfter).To(BeNumerically("~", after.Sub(before), 5*time.Second), "told to wait for the anchor")
			s.ShiftCalendar(time.Until(after.Add(10 * time.Second)))
			Expect(admit(l, p, "alice", "", 1000, 0).Refusal).To(BeNil(), "a new window starts at zero")
		},
		// Berlin moved to summer time on 29 March 2026: March is 743 hours, and April
		// starts at 22:00 UTC, not 23:00.
		Entry("a month in Berlin across the daylight-saving change", `{every: month, time_zone: Europe/Berlin}`,
			time.Date(2026, 3, 31, 21, 59, 30, 0, time.UTC), time.Date(2026, 3, 31, 22, 0, 0, 0, time.UTC)),
		// On the 31st, every month: February 2026 has 28 days, so its window starts on
		// its last day.
		Entry("the 31st of a 28-day February", `{every: month, day_of_month: 31}`,
			time.Date(2026, 2, 27, 23, 59, 30, 0, time.UTC), time.Date(2026, 2, 28, 0, 0, 0, 0, time.UTC)),
		Entry("a day at 09:00 in New York the morning clocks go back", `{every: day, time_zone: America/New_York, at: "09:00"}`,
			time.Date(2026, 11, 1, 13, 59, 30, 0, time.UTC), time.Date(2026, 11, 1, 14, 0, 0, 0, time.UTC)),
	)

	It("never overspends a cost budget by more than one request under 500 concurrent requests", func() {
		p := redisPolicy(`
  - {name: team-dollars, dimension: global, amount: cost, windows: [{limit: 1, calendar: {every: month}}]}
`)
		// Each request reserves 33 output tokens, $0.00825; it uses what it reserved.
		var wg sync.WaitGroup
		var mu sync.Mutex
		admitted := 0
		for range 500 {
			wg.Go(func() {
				dec := admit(l, p, "alice", "gpt-4o", 1, 33)
				if dec.Refusal == nil {
					dec.Hold.Settle(budget.Used{Input: 1, Output: 33})
					mu.Lock()
					admitted++
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		spent := float64(admitted) * 33 * 250 / 1e6
		Expect(spent).To(BeNumerically("<=", 1+33*250/1e6))
		Expect(admitted).To(Equal(121), "$1 holds 121 requests of $0.00825")
		start, _ := (&config.Calendar{Every: config.EveryMonth}).Span(time.Now())
		Expect(level(budget.Key{Kind: budget.Calendar, Dim: budget.Global, Rule: "team-dollars", Start: start.Unix()})).To(BeNumerically("~", 1-spent, 1e-9))
	})

	It("never fails open on a durable rule: refuses while Redis is unreachable, whatever the fallback", func() {
		down, err := redisstore.New(redisstore.Options{URL: "redis://127.0.0.1:1", DialTimeout: 50 * time.Millisecond,
			ReadTimeout: 50 * time.Millisecond, WriteTimeout: 50 * time.Millisecond, Fallback: budget.NewMemory(budget.SystemClock{}, 100)})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(down.Close)
		dl := budget.NewLimiter(down, budget.NopRecorder{}, budget.SystemClock{}, false)
		p := redisPolicy(`
  - {name: minute, dimension: api_key, windows: [{limit: 1000, rolling: {period: minute}}]}
  - {name: dollars, dimension: api_key, subjects: [alice], amount: cost, windows: [{limit: 10, rolling: {period: day}}]}
`)
		_, err = dl.Admit(context.Background(), p, budget.Identity{Key: p.Key("alice"), Model: "gpt-4o"}, budget.Ask{Input: 1, Output: 1})
		var unavailable *budget.UnavailableError
		Expect(errors.As(err, &unavailable)).To(BeTrue(), fmt.Sprint(err))
		dec, err := dl.Admit(context.Background(), p, budget.Identity{Key: p.Key("bob"), Model: "gpt-4o"}, budget.Ask{Input: 1, Output: 1})
		Expect(err).NotTo(HaveOccurred(), "a rolling token rule falls back to the replica's share")
		Expect(dec.Refusal).To(BeNil())
	})
})
