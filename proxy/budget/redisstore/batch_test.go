// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package redisstore_test

import (
	"context"
	"slices"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/test/redisserver"
)

var _ = Describe("Reservations waiting together", func() {
	ctx := context.Background()

	// together makes the reservations while Redis is paused, so that all but the ones
	// the workers already sent wait for one pipeline, and returns their results in the
	// order made once Redis answered.
	together := func(own *redisserver.Server, s interface {
		Reserve(context.Context, *budget.Reservation) (budget.Result, error)
		Waiting() int
	}, rs []*budget.Reservation) []budget.Result {
		Expect(own.Pause()).To(Succeed())
		results := make([]budget.Result, len(rs))
		var wg sync.WaitGroup
		for i := range rs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer GinkgoRecover()
				var err error
				results[i], err = s.Reserve(ctx, rs[i])
				Expect(err).NotTo(HaveOccurred())
			}()
		}
		// What the worker took waits for paused Redis; everything else in the queue.
		Eventually(s.Waiting).WithTimeout(5 * time.Second).WithPolling(time.Millisecond).Should(Equal(len(rs)))
		Expect(own.Resume()).To(Succeed())
		wg.Wait()
		return results
	}

	It("admits them all by their sum when every bucket holds it, with the levels one by one gives", func() {
		own, s := ownStore()
		start := time.Now()
		team := budget.Charge{Key: budget.Key{Kind: budget.TokensMinute, Dim: budget.Team, ID: "research"}, SharedCapacity: 100000, SharedRate: still}
		model := budget.Charge{Key: budget.Key{Kind: budget.TokensDay, Dim: budget.Model, ID: "gpt-4o"}, SharedCapacity: 1000000, SharedRate: still}
		reqs := budget.Charge{Key: budget.Key{Kind: budget.Requests, Dim: budget.APIKey, ID: "a"}, SharedCapacity: 50, SharedRate: still}
		Expect(s.Reserve(ctx, &budget.Reservation{Tokens: budget.WithAmount([]budget.Charge{team}, 0)})).To(HaveField("Admitted", true)) // loads the script
		before, _ := commandstat(s, "evalsha")

		var rs []*budget.Reservation
		for range 40 {
			rs = append(rs, &budget.Reservation{Requests: []budget.Charge{reqs}, Tokens: budget.WithAmount([]budget.Charge{team, model}, 1000)})
		}
		results := together(own, s, rs)
		after, _ := commandstat(s, "evalsha")
		Expect(after-before).To(BeNumerically("<=", 3), "40 reservations in a few calls")

		// One by one, the reservations in arrival order leave each bucket one amount
		// lower than the one before: every level from one amount down to 40 amounts
		// below full, each once.
		var teamLevels, modelLevels, reqLevels []float64
		for _, r := range results {
			Expect(r.Admitted).To(BeTrue())
			Expect(r.TokenWarned).To(BeNil())
			reqLevels = append(reqLevels, r.RequestLevels[0])
			teamLevels = append(teamLevels, r.TokenLevels[0])
			modelLevels = append(modelLevels, r.TokenLevels[1])
		}
		for _, c := range []struct {
			levels []float64
			full   float64
			amount float64
		}{{teamLevels, 100000, 1000}, {modelLevels, 1000000, 1000}, {reqLevels, 50, 1}} {
			slices.Sort(c.levels)
			for i, l := range c.levels {
				want := c.full - float64(len(c.levels)-i)*c.amount
				Expect(l).To(BeNumerically("~", want, slack(still, start)), "level %d", i)
			}
		}
		for k, want := range map[budget.Key]float64{team.Key: 60000, model.Key: 960000, reqs.Key: 10} {
			l, _, err := s.Level(ctx, k)
			Expect(err).NotTo(HaveOccurred())
			Expect(l).To(BeNumerically("~", want, slack(still, start)), k.Dim.String())
		}
	})

	It("decides them one by one when a bucket cannot hold the sum, taking nothing for the sum", func() {
		own, s := ownStore()
		start := time.Now()
		// The team bucket holds 25 of the 40 reservations; the model bucket all of them.
		team := budget.Charge{Key: budget.Key{Kind: budget.TokensMinute, Dim: budget.Team, ID: "research"}, SharedCapacity: 25500, SharedRate: still}
		model := budget.Charge{Key: budget.Key{Kind: budget.TokensDay, Dim: budget.Model, ID: "gpt-4o"}, SharedCapacity: 1000000, SharedRate: still}
		Expect(s.Reserve(ctx, &budget.Reservation{Tokens: budget.WithAmount([]budget.Charge{team}, 0)})).To(HaveField("Admitted", true))
		var rs []*budget.Reservation
		for range 40 {
			rs = append(rs, &budget.Reservation{Tokens: budget.WithAmount([]budget.Charge{model, team}, 1000)})
		}
		admitted := 0
		for _, r := range together(own, s, rs) {
			if r.Admitted {
				admitted++
				continue
			}
			Expect(r.RefusedBy).To(Equal(budget.TokensMinute))
		}
		Expect(admitted).To(Equal(25))
		for k, want := range map[budget.Key]float64{team.Key: 500, model.Key: 975000} {
			l, _, err := s.Level(ctx, k)
			Expect(err).NotTo(HaveOccurred())
			Expect(l).To(BeNumerically("~", want, slack(still, start)), k.Dim.String())
		}
	})

	It("decides them one by one when they recorded a bucket with other parameters (a reload between them)", func() {
		own, s := ownStore()
		start := time.Now()
		old := budget.Charge{Key: budget.Key{Kind: budget.TokensMinute, Dim: budget.Team, ID: "research"}, SharedCapacity: 10000, SharedRate: still}
		reloaded := old
		reloaded.SharedCapacity = 20000
		Expect(s.Reserve(ctx, &budget.Reservation{Tokens: budget.WithAmount([]budget.Charge{old}, 0)})).To(HaveField("Admitted", true))
		// One by one, a reservation under the other capacity scales the level to its
		// own, keeping the bucket's fraction: five of 1,000 under 10,000 take half of
		// it, five under 20,000 a quarter, in any order. A quarter is left, of the
		// capacity the last one recorded: 2,500 or 5,000 (their sum, 10,000, would
		// have emptied it).
		var rs []*budget.Reservation
		for i := range 10 {
			ch := old
			if i%2 == 1 {
				ch = reloaded
			}
			rs = append(rs, &budget.Reservation{Tokens: budget.WithAmount([]budget.Charge{ch}, 1000)})
		}
		for _, r := range together(own, s, rs) {
			Expect(r.Admitted).To(BeTrue())
		}
		l, _, err := s.Level(ctx, old.Key)
		Expect(err).NotTo(HaveOccurred())
		Expect(l).To(Or(BeNumerically("~", 2500, slack(still, start)), BeNumerically("~", 5000, slack(still, start))))
	})

	It("decides a reservation that names one bucket twice as one by one does", func() {
		own, s := ownStore()
		start := time.Now()
		team := budget.Charge{Key: budget.Key{Kind: budget.TokensMinute, Dim: budget.Team, ID: "research"}, SharedCapacity: 100000, SharedRate: still}
		Expect(s.Reserve(ctx, &budget.Reservation{Tokens: budget.WithAmount([]budget.Charge{team}, 0)})).To(HaveField("Admitted", true))
		var rs []*budget.Reservation
		for range 10 {
			rs = append(rs, &budget.Reservation{Tokens: budget.WithAmount([]budget.Charge{team, team}, 1000)})
		}
		for _, r := range together(own, s, rs) {
			Expect(r.Admitted).To(BeTrue())
		}
		// One by one, both entries read the bucket as it was and write it back one
		// amount lower: the amount is taken once.
		l, _, err := s.Level(ctx, team.Key)
		Expect(err).NotTo(HaveOccurred())
		Expect(l).To(BeNumerically("~", 90000, slack(still, start)), "each took its amount once")
	})
})
