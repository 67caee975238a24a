// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package redisstore_test

import (
	"context"
	"errors"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/redis/go-redis/v9"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/proxy/budget/redisstore"
	"github.com/tokenwarden/tokenwarden/proxy/config"
	"github.com/tokenwarden/tokenwarden/test/redisserver"
)

var _ = Describe("The trust fence of durable counters", func() {
	const rules = `
  - {name: minute, dimension: api_key, windows: [{limit: 100000, rolling: {period: minute}}]}
  - {name: monthly, dimension: api_key, subjects: [alice], amount: cost, windows: [{limit: 1, calendar: {every: month}}]}
`
	var (
		own *redisserver.Server
		p   *budget.Policy
	)
	BeforeEach(func() {
		own = redisserver.Start(GinkgoT())
		p = redisPolicy(rules)
	})
	open := func(epoch string) (*redisstore.Store, *budget.Limiter) {
		s, err := redisstore.New(redisstore.Options{URL: own.URL(), Epoch: epoch, DialTimeout: time.Second,
			ReadTimeout: time.Second, WriteTimeout: time.Second, Backoff: 20 * time.Millisecond})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(s.Close)
		return s, budget.NewLimiter(s, budget.NopRecorder{}, budget.SystemClock{}, false)
	}
	// try admits alice on gpt-4o for a quarter (1,000 output tokens) and settles it.
	try := func(l *budget.Limiter, key string) (budget.Decision, error) {
		dec, err := l.Admit(context.Background(), p, budget.Identity{Key: p.Key(key), Model: "gpt-4o"}, budget.Ask{Input: 1, Output: 1000})
		if err == nil && dec.Hold != nil {
			dec.Hold.Settle(budget.Used{Input: 1, Output: 1000})
		}
		return dec, err
	}
	// fencedErr waits, through the reconnection after a restart, for alice's durable
	// admission to be fenced.
	fencedErr := func(l *budget.Limiter) *budget.RecoveringError {
		GinkgoHelper()
		var rec *budget.RecoveringError
		Eventually(func() error {
			_, err := try(l, "alice")
			if errors.As(err, &rec) {
				return nil
			}
			return errors.New("not fenced: " + errors.Join(err).Error())
		}).WithTimeout(5 * time.Second).WithPolling(20 * time.Millisecond).Should(Succeed())
		return rec
	}
	monthly := func(s *redisstore.Store) float64 {
		GinkgoHelper()
		start, _ := (&config.Calendar{Every: config.EveryMonth}).Span(time.Now())
		v, ok, err := s.Level(context.Background(), budget.Key{Kind: budget.Calendar, Dim: budget.APIKey, ID: "alice", Rule: "monthly", Start: start.Unix()})
		Expect(err).NotTo(HaveOccurred())
		Expect(ok).To(BeTrue())
		return v
	}

	It("creates an epoch in a brand-new Redis and fences nothing", func() {
		s, l := open("")
		dec, err := try(l, "alice")
		Expect(err).NotTo(HaveOccurred())
		Expect(dec.Refusal).To(BeNil())
		ep := s.Epochs()
		Expect(ep).To(HaveLen(1))
		Expect(ep[0].Fenced).To(BeFalse())
		Expect(redisstore.ValidEpoch(ep[0].Epoch)).To(BeTrue(), ep[0].Epoch)
		held, err := s.Client().Get(context.Background(), "{tokenwarden}:epoch").Result()
		Expect(err).NotTo(HaveOccurred())
		Expect(held).To(Equal(ep[0].Epoch))
		created, _ := redisstore.EpochCreated(held)
		Expect(created).To(BeTemporally("~", time.Now(), 5*time.Second), "created on the Redis clock")

		other, ol := open(ep[0].Epoch)
		_, err = try(ol, "alice")
		Expect(err).NotTo(HaveOccurred(), "a replica configured with the store's epoch is trusted")
		Expect(other.Epochs()[0].Fenced).To(BeFalse())
		Expect(monthly(s)).To(BeNumerically("~", 0.5, 1e-9), "two quarters spent")
	})

	for _, loss := range []string{"restarted without persistence", "flushed"} {
		It("fences the durable rule after Redis "+loss+", keeps rolling rules, and recovers by a restore", func() {
			s, l := open("")
			for range 2 {
				_, err := try(l, "alice")
				Expect(err).NotTo(HaveOccurred())
			}
			Expect(monthly(s)).To(BeNumerically("~", 0.5, 1e-9))
			before := s.Epochs()[0].Epoch

			if loss == "flushed" {
				Expect(s.Client().FlushAll(context.Background()).Err()).To(Succeed())
			} else {
				Expect(own.Restart()).To(Succeed())
			}
			lostAt := time.Now().UnixMilli()
			rec := fencedErr(l)
			Expect(rec.Expected).To(Equal(before))
			Expect(rec.Found).To(BeEmpty(), "the store holds no epoch")
			fenced := s.Epochs()[0]
			Expect(fenced.FencedAt).To(BeNumerically(">=", lostAt), "when the fence began")
			Expect(fenced.FencedAt).To(BeNumerically("<=", time.Now().UnixMilli()))
			at := fenced.FencedAt
			fenced.FencedAt = 0
			Expect(fenced).To(Equal(budget.GroupEpoch{Group: "tokenwarden", Epoch: before, Fenced: true}))
			time.Sleep(2 * time.Millisecond) // a later refusal, on the wall clock the fence is told on
			_, _ = try(l, "alice")
			Expect(s.Epochs()[0].FencedAt).To(Equal(at), "a later refusal does not move it")
			dec, err := try(l, "bob")
			Expect(err).NotTo(HaveOccurred(), "bob draws on no durable rule: rolling rules are unaffected")
			Expect(dec.Refusal).To(BeNil())
			_, err = try(l, "alice")
			Expect(errors.As(err, &rec)).To(BeTrue(), "fenced until attested, however often asked")

			ch, err := l.RestoreCharge(p, budget.Balance{Rule: "monthly", Subject: "alice", Spent: 0.5})
			Expect(err).NotTo(HaveOccurred())
			after, err := s.Attest(context.Background(), []budget.Charge{ch})
			Expect(err).NotTo(HaveOccurred())
			Expect(after).NotTo(Equal(before))
			Expect(s.Epochs()[0]).To(Equal(budget.GroupEpoch{Group: "tokenwarden", Epoch: after}))
			Expect(monthly(s)).To(BeNumerically("~", 0.5, 1e-9), "the restored balance")
			for range 2 {
				dec, err := try(l, "alice")
				Expect(err).NotTo(HaveOccurred())
				Expect(dec.Refusal).To(BeNil())
			}
			dec, err = try(l, "alice")
			Expect(err).NotTo(HaveOccurred())
			Expect(dec.Refusal).NotTo(BeNil(), "the restored half dollar counts: a fifth quarter does not fit in $1")
		})
	}

	It("fences a replica whose config names an epoch the store does not hold, until its config names the attested one", func() {
		s, l := open("1700000000000-00000000000000aa") // a fleet that ran on another Redis
		rec := fencedErr(l)
		Expect(rec.Found).To(BeEmpty())
		Expect(s.Epochs()[0].Fenced).To(BeTrue())

		other, ol := open("1700000000000-00000000000000aa")
		_ = fencedErr(ol)
		e, err := other.Attest(context.Background(), nil) // start the windows from what Redis holds
		Expect(err).NotTo(HaveOccurred())
		_, err = try(ol, "alice")
		Expect(err).NotTo(HaveOccurred(), "the attesting replica runs under the new epoch at once")

		rec = fencedErr(l)
		Expect(rec.Found).To(Equal(e), "the other replica still runs under the old epoch: fenced until its config names the new one")
		s.SetEpoch(e)
		_, err = try(l, "alice")
		Expect(err).NotTo(HaveOccurred())
		Expect(s.Epochs()[0].Fenced).To(BeFalse())
		s.SetEpoch("1700000000000-00000000000000aa")
		Expect(s.Epochs()[0].Epoch).To(Equal(e), "an older epoch in a late config does not undo an attestation")
	})

	It("is no loss on a failover to a replica that holds the counters: the epoch is replicated with them", func() {
		s, l := open("")
		_, err := try(l, "alice")
		Expect(err).NotTo(HaveOccurred())
		epoch := s.Epochs()[0].Epoch

		replica := redisserver.Start(GinkgoT())
		rc := redis.NewClient(&redis.Options{Addr: replica.Addr()})
		DeferCleanup(rc.Close)
		host, port, _ := strings.Cut(own.Addr(), ":")
		Expect(rc.ReplicaOf(context.Background(), host, port).Err()).To(Succeed())
		Eventually(func() string {
			info, _ := rc.Info(context.Background(), "replication").Result()
			return info
		}).WithTimeout(10 * time.Second).Should(ContainSubstring("master_link_status:up"))
		Eventually(func() string { return rc.Get(context.Background(), "{tokenwarden}:epoch").Val() }).Should(Equal(epoch))
		Expect(own.Kill()).To(Succeed())
		Expect(rc.ReplicaOf(context.Background(), "NO", "ONE").Err()).To(Succeed()) // promoted

		promoted, err := redisstore.New(redisstore.Options{URL: replica.URL(), Epoch: epoch, DialTimeout: time.Second,
			ReadTimeout: time.Second, WriteTimeout: time.Second})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(promoted.Close)
		pl := budget.NewLimiter(promoted, budget.NopRecorder{}, budget.SystemClock{}, false)
		_, err = try(pl, "alice")
		Expect(err).NotTo(HaveOccurred())
		Expect(promoted.Epochs()[0].Fenced).To(BeFalse())
		Expect(monthly(promoted)).To(BeNumerically("~", 0.5, 1e-9), "the counter came with the epoch")
	})
})
