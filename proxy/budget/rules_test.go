// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package budget_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	. "github.com/onsi/gomega/gstruct"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/proxy/budget/storetest"
	"github.com/tokenwarden/tokenwarden/proxy/config"
	"github.com/tokenwarden/tokenwarden/proxy/metrics"
)

// rulesPolicy is a document with keys of teams research, support and sales (two keys
// of research: alice and amir), and the rate_limiting block given.
func rulesPolicy(rateLimiting string) *budget.Policy {
	GinkgoHelper()
	var keys string
	for i, k := range [][3]string{{"alice", "ann", "research"}, {"amir", "ann", "research"}, {"bob", "bo", "support"}, {"carol", "cy", "sales"}} {
		keys += fmt.Sprintf("- {name: %s, user: %s, team: %s, key_sha256: \"%064x\"}\n", k[0], k[1], k[2], i+1)
	}
	c, err := config.Parse([]byte(`
upstreams: [{name: default, url: "http://127.0.0.1:1"}]
models:
- {name: gpt-4o, price: {input: 2.5, output: 10, cached_input: 1.25}}
api_keys:
` + keys + `rate_limiting:
  budget_division: {replicas: 1}
` + rateLimiting))
	Expect(err).NotTo(HaveOccurred())
	return budget.NewPolicy(c)
}

// rig is a limiter on a fresh memory store and fake clock.
type rig struct {
	l     *budget.Limiter
	mem   *budget.Memory
	clock *storetest.Clock
	p     *budget.Policy
}

func newRig(p *budget.Policy) *rig {
	clock := storetest.NewClock()
	mem := budget.NewMemory(clock, 1000)
	return &rig{l: budget.NewLimiter(mem, budget.NopRecorder{}, clock, false), mem: mem, clock: clock, p: p}
}

func (r *rig) admit(key, model string, in, out int64) budget.Decision {
	GinkgoHelper()
	dec, err := r.l.Admit(context.Background(), r.p, budget.Identity{Key: r.p.Key(key), Model: model}, budget.Ask{Input: in, Output: out})
	Expect(err).NotTo(HaveOccurred())
	return dec
}

// admitted admits and settles at once on what was reserved.
func (r *rig) admitted(key, model string, in, out int64) bool {
	GinkgoHelper()
	dec := r.admit(key, model, in, out)
	if dec.Hold != nil {
		dec.Hold.Settle(budget.Used{Input: in, Output: out})
	}
	return dec.Refusal == nil
}

var _ = Describe("Rules", func() {
	It("gives named teams their own budgets and every other team the default", func() {
		// "team research 6,000 a minute, team support 1,000, every other team 500".
		r := newRig(rulesPolicy(`
  limits:
    per_team: {tokens_per_minute: 500}
  rules:
  - {name: team-research, dimension: team, subjects: [research], windows: [{limit: 6000, rolling: {period: minute}}]}
  - {name: team-support, dimension: team, subjects: [support], windows: [{limit: 1000, rolling: {period: minute}}]}
`))
		Expect(r.admitted("alice", "", 3000, 1000)).To(BeTrue(), "research's 6,000 replaces the default 500")
		Expect(r.admitted("amir", "", 1500, 500)).To(BeTrue(), "both research keys draw on one team counter")
		Expect(r.admitted("amir", "", 1, 0)).To(BeFalse(), "research spent its 6,000")
		Expect(r.admitted("bob", "", 800, 0)).To(BeTrue(), "support's 1,000 replaces the default")
		Expect(r.admitted("bob", "", 300, 0)).To(BeFalse())
		dec := r.admit("carol", "", 501, 0)
		Expect(dec.Refusal).NotTo(BeNil(), "sales has the default 500")
		Expect(dec.Refusal.Rule).To(BeEmpty(), "refused by limits.per_team")
		Expect(dec.Refusal.Dimension).To(Equal(budget.Team))
		Expect(r.admitted("carol", "", 500, 0)).To(BeTrue())
	})

	It("never lifts an enforced budget for a named warn rule", func() {
		r := newRig(rulesPolicy(`
  limits:
    per_team: {tokens_per_minute: 500}
  rules:
  - {name: watch-research, dimension: team, subjects: [research], action: warn, windows: [{limit: 300, rolling: {period: minute}}]}
`))
		dec := r.admit("alice", "", 400, 0)
		Expect(dec.Refusal).To(BeNil())
		Expect(dec.Warnings).To(Equal([]budget.Warning{{Rule: "watch-research", Window: "minute"}}))
		Expect(r.admitted("alice", "", 200, 0)).To(BeFalse(), "the team's 500 still refuses")
	})

	It("counts requests per key per model", func() {
		r := newRig(rulesPolicy(`
  rules:
  - {name: key-model-rpm, dimension: api_key, count_by: model, amount: requests, windows: [{limit: 2, rolling: {period: minute}}]}
`))
		Expect(r.admitted("alice", "gpt-4o", 10, 10)).To(BeTrue())
		Expect(r.admitted("alice", "gpt-4o", 10, 10)).To(BeTrue())
		dec := r.admit("alice", "gpt-4o", 10, 10)
		Expect(dec.Refusal).NotTo(BeNil())
		Expect(dec.Refusal.Requests).To(BeTrue())
		Expect(dec.Refusal.Rule).To(Equal("key-model-rpm"))
		Expect(dec.Refusal.Scoped).To(BeTrue(), "the key's own counter: a refusal may name it")
		Expect(dec.Refusal.RetryAfter).To(Equal(30*time.Second), "one request refills in 30 s at 2 a minute")
		Expect(dec.KeyRequests).To(HaveField("Remaining", int64(0)))
		Expect(r.admitted("alice", "gpt-4o-mini", 10, 10)).To(BeTrue(), "another model is another counter")
		Expect(r.admitted("amir", "gpt-4o", 10, 10)).To(BeTrue(), "another key is another counter")
		Expect(r.admitted("alice", "", 10, 10)).To(BeTrue(), "a request without a model has no counter of this rule")
	})

	It("limits input and output tokens apart, and settles each on its own usage", func() {
		r := newRig(rulesPolicy(`
  rules:
  - {name: key-input, dimension: api_key, amount: input_tokens, windows: [{limit: 1000, rolling: {period: minute}}]}
  - {name: key-output, dimension: api_key, amount: output_tokens, windows: [{limit: 500, rolling: {period: minute}}]}
`))
		dec := r.admit("alice", "", 900, 400)
		Expect(dec.Refusal).To(BeNil())
		Expect(dec.KeyInput).To(HaveField("Remaining", int64(100)))
		Expect(dec.KeyOutput).To(HaveField("Remaining", int64(100)))
		Expect(dec.KeyMinute.Present).To(BeFalse(), "no tokens budget")
		refused := r.admit("alice", "", 200, 10)
		Expect(refused.Refusal).NotTo(BeNil())
		Expect(refused.Refusal.Rule).To(Equal("key-input"))
		Expect(refused.Refusal.Amount).To(Equal(budget.AmountInput))
		Expect(refused.Refusal.Asked).To(Equal(200.0))
		Expect(r.admit("alice", "", 10, 200).Refusal).To(HaveField("Rule", "key-output"))
		// The answer used 100 of the 400 output tokens reserved: 300 come back to the
		// output counter, and none to the input one.
		dec.Hold.Settle(budget.Used{Input: 900, Output: 100})
		ok := r.admit("alice", "", 50, 350)
		Expect(ok.Refusal).To(BeNil())
		Expect(ok.KeyOutput.Remaining).To(Equal(int64(50)))
		Expect(ok.KeyInput.Remaining).To(Equal(int64(50)))
	})

	It("counts cached input tokens at cached_input_weight, and prices them at cached_input", func() {
		r := newRig(rulesPolicy(`
  cached_input_weight: 0.25
  limits:
    per_api_key: {tokens_per_minute: 10000}
  rules:
  - {name: key-input, dimension: api_key, amount: input_tokens, windows: [{limit: 5000, rolling: {period: minute}}]}
`))
		dec := r.admit("alice", "gpt-4o", 4000, 1000)
		Expect(dec.Refusal).To(BeNil())
		// 4,000 input tokens, 3,200 of them cached: they count 800 + 3,200/4 = 1,600.
		dec.Hold.Settle(budget.Used{Input: 4000, Output: 1000, Cached: 3200})
		next := r.admit("alice", "gpt-4o", 1, 0)
		Expect(next.KeyInput.Remaining).To(Equal(int64(5000 - 1600 - 1)))
		Expect(next.KeyMinute.Remaining).To(Equal(int64(10000 - 2600 - 1)))
		cost, ok := r.p.Cost("gpt-4o", budget.Used{Input: 4000, Output: 1000, Cached: 3200})
		Expect(ok).To(BeTrue())
		Expect(cost).To(BeNumerically("~", (800*2.5+3200*1.25+1000*10)/1e6, 1e-12))
	})

	// Sizing the bucket for a legitimate burst: a tenant contracted for
	// 200,000 tokens a minute (3,333 a second) sends 1.5 requests a second, each
	// reserving 1,924 tokens (900 input, 1,024 output ceiling) and using 1,154 (770
	// refunded about 4 s later). A promotion raises that to 2.5 times the rate for 30
	// s: it draws about 4,300 a second against a refill of 3,333, a deficit of about
	// 30,000 plus 11,500 held by reservations in flight, about 13 s of refill. A
	// bucket of 5 s refuses part of the burst; one of 20 s absorbs it.
	DescribeTable("sizes the bucket for a promotion's burst",
		func(burstSeconds int, refusesSome bool) {
			r := newRig(rulesPolicy(fmt.Sprintf(`
  rules:
  - {name: app-contract, dimension: api_key, windows: [{limit: 200000, rolling: {period: minute, burst_seconds: %d}}]}
`, burstSeconds)))
			type inFlight struct {
				h  *budget.Hold
				at time.Duration
			}
			var flying []inFlight
			refused, sent := 0, 0
			step := 10 * time.Millisecond
			var next time.Duration
			for t := time.Duration(0); t < 150*time.Second; t += step {
				// Settle what finished: 4 s after admission.
				for len(flying) > 0 && flying[0].at+4*time.Second <= t {
					flying[0].h.Settle(budget.Used{Input: 900, Output: 254})
					flying = flying[1:]
				}
				if t >= next {
					rate := 1.5
					if t >= 60*time.Second && t < 90*time.Second {
						rate = 3.75 // the promotion: 2.5 times the rate for 30 s
					}
					next = t + time.Duration(float64(time.Second)/rate)
					dec := r.admit("alice", "", 900, 1024)
					if t >= 60*time.Second {
						sent++
					}
					if dec.Refusal != nil {
						refused++
					} else {
						flying = append(flying, inFlight{h: dec.Hold, at: t})
					}
				}
				r.clock.Advance(step)
			}
			GinkgoWriter.Printf("burst %d s: %d of %d refused\n", burstSeconds, refused, sent)
			if refusesSome {
				Expect(refused).To(BeNumerically(">", sent/20), "a 5 s bucket refuses part of the burst")
			} else {
				Expect(refused).To(BeZero(), "a 20 s bucket absorbs the burst")
			}
		},
		Entry("a 5-second bucket", 5, true),
		Entry("a 20-second bucket", 20, false),
	)

	It("never refuses on a warn rule: takes nothing when the request does not fit, and reports it", func() {
		r := newRig(rulesPolicy(`
  limits:
    per_api_key: {tokens_per_minute: 2000}
  rules:
  - {name: watch-keys, dimension: api_key, action: warn, windows: [{limit: 1000, rolling: {period: minute}}]}
`))
		key := budget.Key{Kind: budget.Rolling, Dim: budget.APIKey, ID: "alice", Rule: "watch-keys"}
		dec := r.admit("alice", "", 800, 0)
		Expect(dec.Refusal).To(BeNil())
		Expect(dec.Warnings).To(BeEmpty())
		dec = r.admit("alice", "", 800, 0)
		Expect(dec.Refusal).To(BeNil(), "warn never refuses")
		Expect(dec.Warnings).To(Equal([]budget.Warning{{Rule: "watch-keys", Window: "minute"}}))
		level, _ := r.mem.Level(key)
		Expect(level).To(Equal(200.0), "the warned request took nothing from the rule's counter")
		Expect(dec.KeyMinute.Remaining).To(Equal(int64(400)), "the headers describe the enforcing budget, not the warn rule")
		dec.Hold.Settle(budget.Used{Input: 100})
		level, _ = r.mem.Level(key)
		Expect(level).To(Equal(200.0), "settlement never touches a counter the request did not draw on")
		dec = r.admit("alice", "", 1200, 0)
		Expect(dec.Refusal).NotTo(BeNil(), "the block budget still refuses")
		Expect(dec.Refusal.Rule).To(BeEmpty())
	})

	It("never lets a looser budget shadow a stricter one", func() {
		r := newRig(rulesPolicy(`
  limits:
    per_team: {tokens_per_minute: 500}
  rules:
  - {name: research-generous, dimension: team, subjects: [research], windows: [{limit: 100000, rolling: {period: minute}}]}
  - {name: fleet-cap, dimension: global, windows: [{limit: 4000, rolling: {period: minute}}]}
  - {name: keys-generous, dimension: api_key, windows: [{limit: 100000, rolling: {period: minute}}]}
`))
		Expect(r.admitted("alice", "", 3000, 0)).To(BeTrue())
		dec := r.admit("amir", "", 1500, 0)
		Expect(dec.Refusal).NotTo(BeNil(), "the global 4,000 refuses though the team's and the key's budgets hold it")
		Expect(dec.Refusal.Rule).To(Equal("fleet-cap"))
		Expect(dec.Refusal.Dimension).To(Equal(budget.Global))
		Expect(dec.Refusal.Scoped).To(BeFalse(), "a shared budget: its name and level are not the caller's")
		Expect(dec.Refusal.Bucket.Present).To(BeFalse())
		Expect(r.admitted("bob", "", 600, 0)).To(BeFalse(), "support keeps the default 500, which the named research rule does not replace")
	})

	It("applies a key's own day override", func() {
		c, err := config.Parse([]byte(`
upstreams: [{name: default, url: "http://127.0.0.1:1"}]
api_keys:
- {name: alice, key_sha256: "0000000000000000000000000000000000000000000000000000000000000001", rate_limit_tokens_per_day: 900}
- {name: bob, key_sha256: "0000000000000000000000000000000000000000000000000000000000000002"}
rate_limiting:
  budget_division: {replicas: 1}
  limits:
    per_api_key: {tokens_per_minute: 600, tokens_per_day: 100000}
`))
		Expect(err).NotTo(HaveOccurred())
		r := newRig(budget.NewPolicy(c))
		Expect(r.admitted("alice", "", 600, 0)).To(BeTrue())
		r.clock.Advance(time.Minute)
		dec := r.admit("alice", "", 400, 0)
		Expect(dec.Refusal).NotTo(BeNil())
		Expect(dec.Refusal.Period).To(Equal(budget.TokensDay))
		Expect(r.admitted("bob", "", 600, 0)).To(BeTrue())
		r.clock.Advance(time.Minute)
		Expect(r.admitted("bob", "", 400, 0)).To(BeTrue(), "bob has per_api_key's day")
	})
})

var _ = Describe("A durable bucket in memory", func() {
	It("is refused as unavailable, never admitted uncharged, when its map is full", func() {
		mem := budget.NewMemory(storetest.NewClock(), 1)
		rolling := func(id string, durable bool) budget.Charge {
			return budget.Charge{Key: budget.Key{Kind: budget.Rolling, Dim: budget.Team, ID: id, Rule: "r"},
				Capacity: 10, Rate: 1, SharedCapacity: 10, SharedRate: 1, Amount: 1, Durable: durable}
		}
		res, err := mem.Reserve(context.Background(), &budget.Reservation{Tokens: []budget.Charge{rolling("a", true)}})
		Expect(err).NotTo(HaveOccurred())
		Expect(res.Admitted).To(BeTrue())
		res, err = mem.Reserve(context.Background(), &budget.Reservation{Tokens: []budget.Charge{rolling("b", false)}})
		Expect(err).NotTo(HaveOccurred())
		Expect(res.TokenSkipped).To(Equal([]bool{true}), "a rolling token bucket fails open on a full map")
		_, err = mem.Reserve(context.Background(), &budget.Reservation{Tokens: []budget.Charge{rolling("c", true)}})
		var unavailable *budget.UnavailableError
		Expect(errors.As(err, &unavailable)).To(BeTrue())
	})
})

var _ = Describe("A rule window's gauges", func() {
	It("show the window's level after an overage, as they did after the reservation", func() {
		// In memory a window rolls (a calendar window lives in Redis); the clock stands
		// still, so nothing refills.
		p := rulesPolicy(`
  overage: debt
  rules:
  - {name: day, dimension: api_key, windows: [{limit: 10000, rolling: {period: day}}]}
`)
		m := metrics.New(prometheus.NewRegistry())
		mem := budget.NewMemory(storetest.NewClock(), 1000)
		l := budget.NewLimiter(mem, m, budget.SystemClock{}, false)
		used := func() float64 { return testutil.ToFloat64(m.RuleUsed.WithLabelValues("day", "day")) }
		admit := func() budget.Decision {
			dec, err := l.Admit(context.Background(), p, budget.Identity{Key: p.Key("alice")}, budget.Ask{Input: 500, Output: 500})
			Expect(err).NotTo(HaveOccurred())
			return dec
		}
		dec := admit()
		Expect(dec.Refusal).To(BeNil())
		Expect(used()).To(BeNumerically("~", 0.1, 1e-9), "1,000 reserved of 10,000")
		Expect(dec.Hold.Settle(budget.Used{Input: 6000, Output: 6000})).To(BeTrue())
		Expect(used()).To(BeNumerically("~", 1.2, 1e-9), "12,000 spent of 10,000: the window is 2,000 over")
		Expect(admit().Refusal).NotTo(BeNil(), "the next request is refused")
		Expect(used()).To(BeNumerically("~", 1.2, 1e-9))
	})
})

var _ = Describe("A rule written in the TokenBudget's words", func() {
	It("is enforced, and listed in the admin endpoint, in the proxy's words", func() {
		p := rulesPolicy(`
  rules:
  - {name: keys, dimension: PerAPIKey, count_by: Model, amount: InputTokens, action: Block, windows: [{limit: "1.5k", rolling: {period: Minute}}]}
`)
		Expect(p.EffectiveRules()).To(ConsistOf(MatchFields(IgnoreExtras, Fields{
			"Rule": Equal("keys"), "Window": Equal("minute"), "Dimension": Equal("api_key"), "CountBy": Equal("model"),
			"Amount": Equal("input_tokens"), "SharedCapacity": Equal(1500.0),
		})))
		r := newRig(p)
		Expect(r.admitted("alice", "gpt-4o", 1500, 0)).To(BeTrue())
		Expect(r.admitted("alice", "gpt-4o", 1, 0)).To(BeFalse(), "the key's 1,500 input tokens a minute for gpt-4o are spent")
	})
})

var _ = Describe("A rule window's gauge after a refund", func() {
	var (
		m     *metrics.Metrics
		mem   *budget.Memory
		clock *storetest.Clock
		l     *budget.Limiter
		p     *budget.Policy
	)
	BeforeEach(func() {
		// 6,000 a minute refills 100 a second.
		p = rulesPolicy(`
  rules:
  - {name: minute, dimension: api_key, windows: [{limit: 6000, rolling: {period: minute}}]}
`)
		m = metrics.New(prometheus.NewRegistry())
		clock = storetest.NewClock()
		mem = budget.NewMemory(clock, 1000)
		l = budget.NewLimiter(mem, m, clock, false)
	})
	used := func() float64 { return testutil.ToFloat64(m.RuleUsed.WithLabelValues("minute", "minute")) }
	// stored is the share of the bucket in use as the store holds it now.
	stored := func() float64 {
		GinkgoHelper()
		level := math.NaN()
		Expect(mem.EachLevel(context.Background(), func(k budget.Key, lv, _ float64) {
			if k.Rule == "minute" {
				level = lv
			}
		})).To(Succeed())
		return (6000 - level) / 6000
	}
	admit := func(in, out int64) budget.Decision {
		GinkgoHelper()
		dec, err := l.Admit(context.Background(), p, budget.Identity{Key: p.Key("alice")}, budget.Ask{Input: in, Output: out})
		Expect(err).NotTo(HaveOccurred())
		Expect(dec.Refusal).To(BeNil())
		return dec
	}

	It("shows the level with the unused reservation back and what refilled meanwhile", func() {
		dec := admit(1000, 3000)
		Expect(used()).To(BeNumerically("~", 4000.0/6000, 1e-9), "4,000 reserved of 6,000")
		clock.Advance(10 * time.Second)
		Expect(dec.Hold.Settle(budget.Used{Input: 1000, Output: 2000})).To(BeTrue())
		// 2,000 left, 1,000 refilled in 10 s, 1,000 refunded: 4,000 of 6,000.
		Expect(used()).To(BeNumerically("~", 2000.0/6000, 1e-9))
		Expect(used()).To(BeNumerically("~", stored(), 1e-9), "the gauge is the bucket's level")
	})

	It("shows the level with the whole reservation back after a release", func() {
		Expect(admit(1000, 1000).Hold.Settle(budget.Used{Input: 1000, Output: 1000})).To(BeTrue())
		dec := admit(1000, 1000)
		Expect(used()).To(BeNumerically("~", 4000.0/6000, 1e-9), "2,000 spent and 2,000 reserved of 6,000")
		Expect(dec.Hold.Release()).To(BeTrue())
		Expect(used()).To(BeNumerically("~", 2000.0/6000, 1e-9), "2,000 spent")
		Expect(used()).To(BeNumerically("~", stored(), 1e-9), "the gauge is the bucket's level")
	})
})
