// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package redisstore_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/redis/go-redis/v9"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/proxy/budget/redisstore"
	"github.com/tokenwarden/tokenwarden/proxy/budget/storetest"
	"github.com/tokenwarden/tokenwarden/proxy/metrics"
	"github.com/tokenwarden/tokenwarden/test/redisserver"
)

func TestRedisStore(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "Redis Store Suite")
}

var (
	srv *redisserver.Server
	// cluster is a Redis Cluster of three masters (cluster_test.go).
	cluster *redisserver.Cluster
)

var _ = BeforeSuite(func() {
	srv = redisserver.Start(GinkgoT())
	cluster = redisserver.StartCluster(GinkgoT(), 3, 0)
})

var prefixes atomic.Int64

// still is a refill rate (a thousandth of a unit per second) for tests about something
// other than refill: the shared buckets keep the Redis server's clock, which a test
// cannot stop, and at this rate it moves a level by next to nothing while a test runs.
const still = 1e-3

// slack is what real time since start can have refilled on a bucket of rate.
func slack(rate float64, start time.Time) float64 { return 1e-6 + rate*time.Since(start).Seconds() }

// newStore is a store on the suite's redis-server, with its own key prefix.
func newStore(clock budget.Clock, fallback *budget.Memory, rec budget.Recorder) *redisstore.Store {
	s, err := redisstore.New(redisstore.Options{
		URL: srv.URL(), Prefix: fmt.Sprintf("t%d", prefixes.Add(1)),
		DialTimeout: 100 * time.Millisecond, ReadTimeout: 100 * time.Millisecond, WriteTimeout: 100 * time.Millisecond,
		Fallback: fallback, Backoff: 300 * time.Millisecond, Clock: clock, Recorder: rec,
	})
	Expect(err).NotTo(HaveOccurred())
	return s
}

var _ = storetest.DescribeStore("redis", storetest.Factory{
	New: func(clock budget.Clock, _ int64) budget.Store { return newStore(clock, nil, nil) },
	Level: func(s budget.Store, k budget.Key) (float64, bool) {
		l, ok, err := s.(*redisstore.Store).Level(context.Background(), k)
		Expect(err).NotTo(HaveOccurred())
		return l, ok
	},
	OwnClock: true,
})

// ownStore is a store on a redis-server of its own, which the test may pause, with
// timeouts that outlast the pause.
func ownStore() (*redisserver.Server, *redisstore.Store) {
	own := redisserver.Start(GinkgoT())
	s, err := redisstore.New(redisstore.Options{URL: own.URL(), DialTimeout: time.Second,
		ReadTimeout: 5 * time.Second, WriteTimeout: 5 * time.Second, Clock: storetest.NewClock()})
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(s.Close)
	return own, s
}

// commandstat reads the calls of one command and Redis' time per call in them.
func commandstat(s *redisstore.Store, cmd string) (calls int64, usecPerCall float64) {
	calls, usec, err := redisserver.Commandstat(context.Background(), s.Client(), cmd)
	Expect(err).NotTo(HaveOccurred())
	return calls, perCall(calls, usec)
}

func commandstatB(b *testing.B, s *redisstore.Store, cmd string) (int64, float64) {
	calls, usec, err := redisserver.Commandstat(context.Background(), s.Client(), cmd)
	if err != nil {
		b.Fatal(err)
	}
	return calls, perCall(calls, usec)
}

func perCall(calls int64, usec float64) float64 {
	if calls == 0 {
		return 0
	}
	return usec / float64(calls)
}

type unavailable struct{ counts map[string]int }

func (u *unavailable) RedisUnavailable(d budget.Dimension, action string) {
	u.counts[d.String()+"/"+action]++
}

type recorder struct {
	budget.NopRecorder
	u *unavailable
}

func (r recorder) RedisUnavailable(d budget.Dimension, action string) {
	r.u.RedisUnavailable(d, action)
}

func everyDimension(amount int64) *budget.Reservation {
	return everyDimensionOf(amount, "x", 1000000)
}

// everyDimensionOf is a reservation of amount on six dimensions times two periods for
// one id, each bucket holding total for the fleet, divided among 4 replicas.
func everyDimensionOf(amount int64, id string, total float64) *budget.Reservation {
	r := &budget.Reservation{}
	for d := budget.Global; d < budget.NumDimensions; d++ {
		for _, k := range []budget.Kind{budget.TokensMinute, budget.TokensDay} {
			secs := k.Period().Seconds()
			r.Tokens = append(r.Tokens, budget.Charge{Key: budget.Key{Kind: k, Dim: d, ID: id},
				Capacity: total / 4, Rate: total / 4 / secs, SharedCapacity: total, SharedRate: total / secs, Amount: float64(amount)})
		}
	}
	return r
}

var _ = Describe("The Redis store", func() {
	ctx := context.Background()

	It("reserves on six dimensions times two periods in one script call, and settles in at most one", func() {
		s := newStore(storetest.NewClock(), nil, nil)
		DeferCleanup(s.Close)
		_, err := s.Reserve(ctx, everyDimension(10)) // loads the script
		Expect(err).NotTo(HaveOccurred())
		before, _ := commandstat(s, "evalsha")
		for i := 0; i < 100; i++ {
			res, err := s.Reserve(ctx, everyDimension(1000))
			Expect(err).NotTo(HaveOccurred())
			Expect(res.Admitted).To(BeTrue())
			Expect(res.Shared).To(BeTrue())
			Expect(res.TokenLevels[0]).To(BeNumerically("<", 1000000), "the shared bucket holds the fleet total")
		}
		afterReserve, usec := commandstat(s, "evalsha")
		Expect(afterReserve - before).To(Equal(int64(100)))
		GinkgoWriter.Printf("reserve script on 12 buckets: %.1f µs per call in Redis\n", usec)
		for i := 0; i < 100; i++ {
			s.Refund(ctx, budget.WithAmount(everyDimension(0).Tokens, 500))
		}
		afterSettle, _ := commandstat(s, "evalsha")
		Expect(afterSettle - afterReserve).To(Equal(int64(100)))
	})

	It("counts the operations it sends and times each pipeline", func() {
		m := metrics.New(prometheus.NewRegistry())
		s := newStore(storetest.NewClock(), nil, m)
		DeferCleanup(s.Close)
		for i := 0; i < 3; i++ {
			_, err := s.Reserve(ctx, everyDimension(10))
			Expect(err).NotTo(HaveOccurred())
		}
		s.Refund(ctx, budget.WithAmount(everyDimension(0).Tokens, 5))
		s.Refund(ctx, budget.WithAmount(everyDimension(0).Tokens, 5))
		s.Charge(ctx, budget.WithAmount(everyDimension(0).Tokens, 5), budget.Debt)
		Expect(testutil.ToFloat64(m.RedisOperations.WithLabelValues("reserve"))).To(Equal(3.0))
		Expect(testutil.ToFloat64(m.RedisOperations.WithLabelValues("refund"))).To(Equal(2.0))
		Expect(testutil.ToFloat64(m.RedisOperations.WithLabelValues("charge"))).To(Equal(1.0))
		var h dto.Metric
		Expect(m.RedisPipelineDuration.Write(&h)).To(Succeed())
		Expect(h.GetHistogram().GetSampleCount()).To(BeNumerically(">=", 5), "a pipeline per call made one at a time")
		Expect(h.GetHistogram().GetSampleSum()).To(BeNumerically(">", 0))
	})

	It("keeps an id's buckets in one key under the fleet's hash tag, expiring when its slowest bucket is full again", func() {
		s := newStore(storetest.NewClock(), nil, nil)
		DeferCleanup(s.Close)
		// The minute bucket refills 300 tokens in 30 ms; the day bucket needs 300 s.
		req := budget.Charge{Key: budget.Key{Kind: budget.Requests, Dim: budget.APIKey, ID: "alice"}, SharedCapacity: 10, SharedRate: 10.0 / 60}
		m := budget.Charge{Key: budget.Key{Kind: budget.TokensMinute, Dim: budget.APIKey, ID: "alice"}, SharedCapacity: 600, SharedRate: 10000}
		d := budget.Charge{Key: budget.Key{Kind: budget.TokensDay, Dim: budget.APIKey, ID: "alice"}, SharedCapacity: 86400, SharedRate: 1}
		t := budget.Charge{Key: budget.Key{Kind: budget.TokensMinute, Dim: budget.Team, ID: "research"}, SharedCapacity: 600, SharedRate: 10}
		start := time.Now()
		_, err := s.Reserve(ctx, &budget.Reservation{Requests: []budget.Charge{req}, Tokens: budget.WithAmount([]budget.Charge{m, d, t}, 300)})
		Expect(err).NotTo(HaveOccurred())
		Expect(s.Key(m.Key)).To(MatchRegexp(`^\{t\d+\}:api_key:alice$`))
		Expect(s.Key(d.Key)).To(Equal(s.Key(m.Key)))
		Expect(s.Key(req.Key)).To(Equal(s.Key(m.Key)))
		Expect(s.Key(t.Key)).To(MatchRegexp(`^\{t\d+\}:team:research$`))
		tag, _, _ := strings.Cut(s.Key(m.Key), "}")
		keys, err := s.Client().Keys(ctx, tag+"}*").Result()
		Expect(err).NotTo(HaveOccurred())
		Expect(keys).To(ConsistOf(s.Key(m.Key), s.Key(t.Key)), "four buckets, two keys")

		Expect(s.Client().PTTL(ctx, s.Key(t.Key)).Val()).To(BeNumerically("~", 31*time.Second, time.Second), "300 tokens at 10 per second, plus a second")
		Expect(s.Client().PTTL(ctx, s.Key(m.Key)).Val()).To(BeNumerically("~", 301*time.Second, time.Second), "as long as the day bucket's refill needs")

		// Once the minute bucket is full again, a refund on it alone never shortens the
		// life the day bucket needs.
		Eventually(func() float64 {
			l, _, err := s.Level(ctx, m.Key)
			Expect(err).NotTo(HaveOccurred())
			return l
		}).Should(BeNumerically("~", 600, 1e-9))
		s.Refund(ctx, budget.WithAmount([]budget.Charge{m}, 100))
		Expect(s.Client().PTTL(ctx, s.Key(m.Key)).Val()).To(BeNumerically("~", 301*time.Second, time.Second))
		for _, c := range []budget.Charge{req, m, d} {
			_, ok, err := s.Level(ctx, c.Key)
			Expect(err).NotTo(HaveOccurred())
			Expect(ok).To(BeTrue(), "%v kept in the key", c.Key)
		}
		l, _, _ := s.Level(ctx, d.Key)
		Expect(l).To(BeNumerically("~", 86400-300, time.Since(start).Seconds()), "the day bucket refills at 1 a second")
		l, _, _ = s.Level(ctx, req.Key)
		Expect(l).To(BeNumerically("~", 9, time.Since(start).Seconds()/6), "the request bucket refills at 10 a minute")
		_, ok, err := s.Level(ctx, budget.Key{Kind: budget.Requests, Dim: budget.Team, ID: "research"})
		Expect(err).NotTo(HaveOccurred())
		Expect(ok).To(BeFalse(), "a slot never written is absent")
	})

	It("decides the reservations waiting together in one call, each all or nothing, never over-admitting", func() {
		own, s := ownStore()
		// A team minute bucket that holds 50 reservations of 1,000 tokens, and a request
		// limit of 80 on each of two keys; neither refills while the test runs.
		start := time.Now()
		team := budget.Charge{Key: budget.Key{Kind: budget.TokensMinute, Dim: budget.Team, ID: "research"}, SharedCapacity: 50500, SharedRate: still}
		reqs := func(key string) budget.Charge {
			return budget.Charge{Key: budget.Key{Kind: budget.Requests, Dim: budget.APIKey, ID: key}, SharedCapacity: 80, SharedRate: still}
		}
		Expect(s.Reserve(ctx, &budget.Reservation{Tokens: budget.WithAmount([]budget.Charge{team}, 0)})).To(HaveField("Admitted", true)) // loads the script
		before, _ := commandstat(s, "evalsha")

		Expect(own.Pause()).To(Succeed())
		results := make([]budget.Result, 200)
		var wg sync.WaitGroup
		for i := range results {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var err error
				results[i], err = s.Reserve(ctx, &budget.Reservation{Requests: []budget.Charge{reqs([]string{"a", "b"}[i%2])},
					Tokens: budget.WithAmount([]budget.Charge{team}, 1000)})
				Expect(err).NotTo(HaveOccurred())
			}()
		}
		time.Sleep(200 * time.Millisecond)
		Expect(own.Resume()).To(Succeed())
		wg.Wait()

		after, _ := commandstat(s, "evalsha")
		Expect(after-before).To(BeNumerically("<=", 12), "200 reservations in a few calls")
		var admitted, byTokens, byRequests int
		for _, r := range results {
			switch {
			case r.Admitted:
				admitted++
				Expect(r.TokenLevels[0]).To(BeNumerically(">=", 500))
			case r.RefusedBy == budget.Requests:
				byRequests++
				Expect(r.RetryAfter).To(BeNumerically("~", 1000*time.Second, time.Since(start)+time.Millisecond), "one request at a thousandth a second")
			default:
				byTokens++
				Expect(r.RefusedBy).To(Equal(budget.TokensMinute))
				Expect(r.RetryAfter).To(BeNumerically(">", 0))
			}
		}
		Expect(admitted).To(Equal(50), "the bucket held 50")
		Expect(byRequests).To(Equal(40), "each key's request limit of 80 refuses 20")
		Expect(byTokens).To(Equal(110))
		l, _, err := s.Level(ctx, team.Key)
		Expect(err).NotTo(HaveOccurred())
		Expect(l).To(BeNumerically("~", 500, slack(still, start)))
		for _, k := range []string{"a", "b"} {
			l, _, err := s.Level(ctx, reqs(k).Key)
			Expect(err).NotTo(HaveOccurred())
			Expect(l).To(BeNumerically("~", 0, slack(still, start)), "a token refusal still takes the request")
		}
	})

	It("splits refunds that gathered on thousands of keys into calls Redis can take", func() {
		own, s := ownStore()
		const ids = 3000 // three keys each: more than one Lua call can unpack
		charges := func(i int) []budget.Charge {
			var cs []budget.Charge
			for _, d := range []budget.Dimension{budget.Client, budget.User, budget.APIKey} {
				cs = append(cs, budget.Charge{Key: budget.Key{Kind: budget.TokensMinute, Dim: d, ID: strconv.Itoa(i)}, SharedCapacity: 1000, SharedRate: still})
			}
			return cs
		}
		start := time.Now()
		var wg sync.WaitGroup
		for w := 0; w < 64; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := w; i < ids; i += 64 {
					res, err := s.Reserve(ctx, &budget.Reservation{Tokens: budget.WithAmount(charges(i), 1000)})
					Expect(err).NotTo(HaveOccurred())
					Expect(res.Admitted).To(BeTrue())
				}
			}()
		}
		wg.Wait()

		Expect(own.Pause()).To(Succeed())
		for i := 0; i < ids; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				s.Refund(ctx, budget.WithAmount(charges(i), 400))
			}()
		}
		time.Sleep(300 * time.Millisecond)
		Expect(own.Resume()).To(Succeed())
		wg.Wait()
		for i := 0; i < ids; i += 37 {
			for _, c := range charges(i) {
				l, _, err := s.Level(ctx, c.Key)
				Expect(err).NotTo(HaveOccurred())
				Expect(l).To(BeNumerically("~", 400, slack(still, start)), "%v refunded", c.Key)
			}
		}
	})

	It("sends a refund with the next reservation, before it, in one call", func() {
		clock := storetest.NewClock()
		s, err := redisstore.New(redisstore.Options{URL: srv.URL(), Prefix: fmt.Sprintf("t%d", prefixes.Add(1)),
			DialTimeout: time.Second, ReadTimeout: time.Second, WriteTimeout: time.Second, Clock: clock,
			RefundLinger: time.Hour}) // the refund goes only with a reservation
		Expect(err).NotTo(HaveOccurred())
		start := time.Now()
		m := budget.Charge{Key: budget.Key{Kind: budget.TokensMinute, Dim: budget.APIKey, ID: "alice"}, SharedCapacity: 1000, SharedRate: still}
		Expect(s.Reserve(ctx, &budget.Reservation{Tokens: budget.WithAmount([]budget.Charge{m}, 1000)})).To(HaveField("Admitted", true))
		before, _ := commandstat(s, "evalsha")

		refunded := make(chan struct{})
		go func() {
			defer close(refunded)
			s.Refund(ctx, budget.WithAmount([]budget.Charge{m}, 600))
		}()
		Consistently(refunded, 100*time.Millisecond).ShouldNot(BeClosed(), "the refund waits for a pipeline")
		res, err := s.Reserve(ctx, &budget.Reservation{Tokens: budget.WithAmount([]budget.Charge{m}, 500)})
		Expect(err).NotTo(HaveOccurred())
		Expect(res.Admitted).To(BeTrue(), "the reservation sees the refund")
		Expect(res.TokenLevels[0]).To(BeNumerically("~", 100, slack(still, start)))
		Eventually(refunded).Should(BeClosed())
		after, _ := commandstat(s, "evalsha")
		Expect(after-before).To(Equal(int64(1)), "one call for both")

		// A refund still gathering when the store closes is answered.
		last := make(chan struct{})
		go func() {
			defer close(last)
			s.Refund(ctx, budget.WithAmount([]budget.Charge{m}, 100))
		}()
		Consistently(last, 50*time.Millisecond).ShouldNot(BeClosed())
		Expect(s.Close()).To(Succeed())
		Eventually(last).Should(BeClosed())
	})

	It("merges the refunds waiting together into one call, bucket by bucket, losing none", func() {
		own, s := ownStore()
		start := time.Now()
		team := func(id string) budget.Charge {
			return budget.Charge{Key: budget.Key{Kind: budget.TokensMinute, Dim: budget.Team, ID: id}, SharedCapacity: 1e6, SharedRate: still}
		}
		global := budget.Charge{Key: budget.Key{Kind: budget.TokensDay, Dim: budget.Global}, SharedCapacity: 1e7, SharedRate: still}
		// 100 holds of 5,000 tokens, on the global day bucket and one of two teams.
		for i := 0; i < 100; i++ {
			res, err := s.Reserve(ctx, &budget.Reservation{Tokens: budget.WithAmount([]budget.Charge{global, team([]string{"a", "b"}[i%2])}, 5000)})
			Expect(err).NotTo(HaveOccurred())
			Expect(res.Admitted).To(BeTrue())
		}
		before, _ := commandstat(s, "evalsha")

		// While Redis is stalled the refunds queue up; when it answers they go in a few
		// merged calls.
		Expect(own.Pause()).To(Succeed())
		var wg sync.WaitGroup
		for i := 0; i < 100; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				s.Refund(ctx, budget.WithAmount([]budget.Charge{global, team([]string{"a", "b"}[i%2])}, float64(1000+i)))
			}()
		}
		time.Sleep(200 * time.Millisecond)
		Expect(own.Resume()).To(Succeed())
		wg.Wait()

		after, _ := commandstat(s, "evalsha")
		Expect(after-before).To(BeNumerically("<=", 10), "100 refunds in at most 10 calls")
		level := func(c budget.Charge) float64 {
			l, ok, err := s.Level(ctx, c.Key)
			Expect(err).NotTo(HaveOccurred())
			Expect(ok).To(BeTrue())
			return l
		}
		// Refunded: 1000+i for each i, 104,950 in all, split by parity between the teams.
		Expect(level(global)).To(BeNumerically("~", 1e7-500000+104950, slack(still, start)))
		Expect(level(team("a"))).To(BeNumerically("~", 1e6-250000+52450, slack(still, start)))
		Expect(level(team("b"))).To(BeNumerically("~", 1e6-250000+52500, slack(still, start)))
	})

	It("overwrites a key it cannot read rather than failing every request on it", func() {
		s := newStore(storetest.NewClock(), nil, nil)
		DeferCleanup(s.Close)
		m := budget.Charge{Key: budget.Key{Kind: budget.TokensMinute, Dim: budget.User, ID: "eve"}, SharedCapacity: 600, SharedRate: 10}
		// Another program's values: a short string, then a day bucket of infinite size.
		Expect(s.Client().Set(ctx, s.Key(m.Key), "not a bucket", 0).Err()).To(Succeed())
		res, err := s.Reserve(ctx, &budget.Reservation{Tokens: budget.WithAmount([]budget.Charge{m}, 100)})
		Expect(err).NotTo(HaveOccurred())
		Expect(res.Shared && res.Admitted).To(BeTrue())
		Expect(res.TokenLevels[0]).To(BeNumerically("~", 500, 1e-6), "an unreadable key is a full bucket")

		v := make([]byte, 96)
		slot := func(i int, x float64) { binary.LittleEndian.PutUint64(v[8*i:], math.Float64bits(x)) }
		for i, x := range []float64{0, 0, -1, 0, 0, 0, -1, 0, 0, 0, math.Inf(1), 1} {
			slot(i, x)
		}
		Expect(s.Client().Set(ctx, s.Key(m.Key), v, 0).Err()).To(Succeed())
		res, err = s.Reserve(ctx, &budget.Reservation{Tokens: budget.WithAmount([]budget.Charge{m}, 100)})
		Expect(err).NotTo(HaveOccurred())
		Expect(res.Shared && res.Admitted).To(BeTrue())
		ttl, err := s.Client().Do(ctx, "PTTL", s.Key(m.Key)).Int64()
		Expect(err).NotTo(HaveOccurred())
		Expect(ttl).To(BeNumerically(">", 0), "a valid TTL, in milliseconds")
	})

	It("sends again, after its scripts were flushed, only the calls that found no script", func() {
		own, s := ownStore()
		start := time.Now()
		x := budget.Charge{Key: budget.Key{Kind: budget.TokensMinute, Dim: budget.Team, ID: "x"}, SharedCapacity: 10000, SharedRate: still}
		y := budget.Charge{Key: budget.Key{Kind: budget.TokensMinute, Dim: budget.Team, ID: "y"}, SharedCapacity: 10000, SharedRate: still}
		Expect(s.Reserve(ctx, &budget.Reservation{Tokens: budget.WithAmount([]budget.Charge{x}, 1000)})).To(HaveField("Admitted", true))

		// Only the charge script survives; the next pipeline holds an overage charge,
		// which runs, and a reservation, which finds no script.
		Expect(s.Client().ScriptFlush(ctx).Err()).To(Succeed())
		Expect(redisstore.ChargeScript.Load(ctx, s.Client()).Err()).To(Succeed())
		Expect(own.Pause()).To(Succeed())
		var wg sync.WaitGroup
		for i := 0; i < 2; i++ { // occupy both workers
			wg.Add(1)
			go func() { defer wg.Done(); s.Charge(ctx, budget.WithAmount([]budget.Charge{y}, 1), budget.Debt) }()
		}
		time.Sleep(50 * time.Millisecond)
		wg.Add(2)
		go func() { defer wg.Done(); s.Charge(ctx, budget.WithAmount([]budget.Charge{x}, 400), budget.Debt) }()
		var res budget.Result
		go func() {
			defer wg.Done()
			res, _ = s.Reserve(ctx, &budget.Reservation{Tokens: budget.WithAmount([]budget.Charge{x}, 1000)})
		}()
		time.Sleep(100 * time.Millisecond)
		Expect(own.Resume()).To(Succeed())
		wg.Wait()

		Expect(res.Admitted).To(BeTrue())
		Expect(res.Shared).To(BeTrue())
		l, _, err := s.Level(ctx, x.Key)
		Expect(err).NotTo(HaveOccurred())
		Expect(l).To(BeNumerically("~", 10000-1000-400-1000, slack(still, start)), "the charge once, the reservation once")
	})

	It("answers every call made while or after it closes, without waiting", func() {
		s := newStore(storetest.NewClock(), nil, nil)
		var wg sync.WaitGroup
		for i := 0; i < 50; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, _ = s.Reserve(ctx, everyDimension(10))
				s.Refund(ctx, budget.WithAmount(everyDimension(0).Tokens, 5))
			}()
		}
		Expect(s.Close()).To(Succeed())
		done := make(chan struct{})
		go func() { wg.Wait(); close(done) }()
		Eventually(done).Should(BeClosed())
		_, err := s.Reserve(ctx, everyDimension(10))
		var ue *budget.UnavailableError
		Expect(err).To(BeAssignableToTypeOf(ue), "no fallback: a closed store is unavailable")
	})

	When("Redis is unreachable", func() {
		It("falls back to this replica's memory at the divided share, and counts it", func() {
			u := &unavailable{counts: map[string]int{}}
			clock := storetest.NewClock()
			mem := budget.NewMemory(clock, 1000)
			local, err := redisstore.New(redisstore.Options{URL: "redis://127.0.0.1:1/0", DialTimeout: 50 * time.Millisecond,
				ReadTimeout: 50 * time.Millisecond, WriteTimeout: 50 * time.Millisecond, Fallback: mem, Clock: clock, Recorder: recorder{u: u}})
			Expect(err).NotTo(HaveOccurred())
			DeferCleanup(local.Close)

			start := time.Now()
			res, err := local.Reserve(ctx, everyDimension(200000))
			Expect(err).NotTo(HaveOccurred())
			Expect(time.Since(start)).To(BeNumerically("<", 2*time.Second), "a refused connection does not hang admission")
			Expect(res.Admitted).To(BeTrue())
			Expect(res.Shared).To(BeFalse())
			Expect(res.Backend).To(BeIdenticalTo(mem), "the hold settles on the backend that took it")
			Expect(res.TokenLevels[0]).To(BeNumerically("~", 50000, 0.01), "250000, the divided share, less 200000")
			res, err = local.Reserve(ctx, everyDimension(200000))
			Expect(err).NotTo(HaveOccurred())
			Expect(res.Admitted).To(BeFalse(), "the fallback never admits more than the replica's share")
			Expect(u.counts["global/fallback_memory"]).To(Equal(2))
			Expect(u.counts["model/fallback_memory"]).To(Equal(2))
		})

		It("treats a Redis out of memory as unreachable, changing nothing in it", func() {
			own := redisserver.Start(GinkgoT())
			clock := storetest.NewClock()
			mem := budget.NewMemory(clock, 1000)
			u := &unavailable{counts: map[string]int{}}
			s, err := redisstore.New(redisstore.Options{URL: own.URL(), DialTimeout: time.Second, ReadTimeout: time.Second,
				WriteTimeout: time.Second, Fallback: mem, Backoff: 100 * time.Millisecond, Recorder: recorder{u: u}})
			Expect(err).NotTo(HaveOccurred())
			DeferCleanup(s.Close)
			start := time.Now()
			res, err := s.Reserve(ctx, everyDimension(1000))
			Expect(err).NotTo(HaveOccurred())
			Expect(res.Shared).To(BeTrue())
			dayBucket := everyDimension(0).Tokens[1] // the global day bucket: 11.6 tokens a second
			level := func() float64 {
				l, _, err := s.Level(ctx, dayBucket.Key)
				Expect(err).NotTo(HaveOccurred())
				return l
			}
			Expect(level()).To(BeNumerically("~", 999000, slack(dayBucket.SharedRate, start)))

			Expect(s.Client().ConfigSet(ctx, "maxmemory", "1").Err()).To(Succeed())
			res, err = s.Reserve(ctx, everyDimension(1000))
			Expect(err).NotTo(HaveOccurred())
			Expect(res.Shared).To(BeFalse(), "admitted on the fallback")
			Expect(u.counts["global/fallback_memory"]).To(Equal(1))
			Expect(level()).To(BeNumerically("~", 999000, slack(dayBucket.SharedRate, start)), "nothing taken in Redis")

			Expect(s.Client().ConfigSet(ctx, "maxmemory", "0").Err()).To(Succeed())
			Eventually(func() bool {
				res, err := s.Reserve(ctx, everyDimension(1000))
				return err == nil && res.Shared
			}, 3*time.Second, 20*time.Millisecond).Should(BeTrue())
			Expect(level()).To(BeNumerically("~", 998000, slack(dayBucket.SharedRate, start)))
		})

		It("says so when Redis answers but refuses the scripts, apart from being unreachable", func() {
			own := redisserver.Start(GinkgoT())
			admin := redis.NewClient(&redis.Options{Addr: own.Addr()})
			DeferCleanup(admin.Close)
			Expect(admin.Do(ctx, "ACL", "SETUSER", "noscripts", "on", ">pw", "~*", "+@all", "-@scripting").Err()).To(Succeed())
			var logs bytes.Buffer
			s, err := redisstore.New(redisstore.Options{URL: "redis://noscripts:pw@" + own.Addr() + "/0",
				DialTimeout: time.Second, ReadTimeout: time.Second, WriteTimeout: time.Second,
				Logger: slog.New(slog.NewTextHandler(&logs, nil))})
			Expect(err).NotTo(HaveOccurred())
			DeferCleanup(s.Close)
			_, err = s.Reserve(ctx, everyDimension(1))
			var ue *budget.UnavailableError
			Expect(err).To(BeAssignableToTypeOf(ue))
			Expect(logs.String()).To(ContainSubstring("Redis refused the budget scripts; refusing requests with 503 until it runs them"))
			Expect(logs.String()).To(ContainSubstring("NOPERM"))

			// The least a fleet's user needs (docs/redis.md): the scripts, and in them
			// TIME, MGET and PSETEX on the keys under its prefix, and GET and SET on its
			// epoch (the trust fence of durable counters).
			Expect(admin.Do(ctx, "ACL", "SETUSER", "fleet", "on", ">pw", "~{fleet-a}:*", "+evalsha", "+script|load", "+time", "+mget", "+psetex", "+get", "+set").Err()).To(Succeed())
			fleet, err := redisstore.New(redisstore.Options{URL: "redis://fleet:pw@" + own.Addr() + "/0", Prefix: "fleet-a",
				DialTimeout: time.Second, ReadTimeout: time.Second, WriteTimeout: time.Second, Clock: storetest.NewClock()})
			Expect(err).NotTo(HaveOccurred())
			DeferCleanup(fleet.Close)
			start := time.Now()
			res, err := fleet.Reserve(ctx, everyDimension(1000))
			Expect(err).NotTo(HaveOccurred())
			Expect(res.Shared && res.Admitted).To(BeTrue())
			durable := &budget.Reservation{Tokens: []budget.Charge{{Key: budget.Key{Kind: budget.Calendar, Dim: budget.Global, Rule: "month", Start: 1},
				SharedCapacity: 10, Amount: 1, EndMillis: time.Now().Add(time.Hour).UnixMilli(), Durable: true}}}
			res, err = fleet.Reserve(ctx, durable)
			Expect(err).NotTo(HaveOccurred(), "the epoch is created")
			Expect(res.Admitted).To(BeTrue())
			_, err = fleet.Attest(ctx, durable.Tokens)
			Expect(err).NotTo(HaveOccurred(), "and attested")
			fleet.Refund(ctx, budget.WithAmount(everyDimension(0).Tokens, 500))
			fleet.Charge(ctx, budget.WithAmount(everyDimension(0).Tokens, 100), budget.Debt)
			reader, err := redisstore.New(redisstore.Options{URL: own.URL(), Prefix: "fleet-a", Clock: storetest.NewClock()}) // the default user may GET
			Expect(err).NotTo(HaveOccurred())
			DeferCleanup(reader.Close)
			dayBucket := everyDimension(0).Tokens[1] // the global day bucket: 11.6 tokens a second
			l, ok, err := reader.Level(ctx, dayBucket.Key)
			Expect(err).NotTo(HaveOccurred())
			Expect(ok).To(BeTrue())
			Expect(l).To(BeNumerically("~", 1000000-1000+500-100, slack(dayBucket.SharedRate, start)), "reserved, refunded and charged")
		})

		It("bounds the fallback's bucket maps per dimension: a flood of clients never opens a key's budget", func() {
			clock := storetest.NewClock()
			mem := budget.NewMemory(clock, 2)
			local, err := redisstore.New(redisstore.Options{URL: "redis://127.0.0.1:1/0", DialTimeout: 50 * time.Millisecond,
				ReadTimeout: 50 * time.Millisecond, WriteTimeout: 50 * time.Millisecond, Fallback: mem, Clock: clock})
			Expect(err).NotTo(HaveOccurred())
			DeferCleanup(local.Close)
			bucket := func(d budget.Dimension, id string) budget.Charge {
				return budget.Charge{Key: budget.Key{Kind: budget.TokensMinute, Dim: d, ID: id}, Capacity: 600, Rate: 10, SharedCapacity: 1200, SharedRate: 20}
			}
			alice := bucket(budget.APIKey, "alice")
			for i := range 5 {
				res, err := local.Reserve(ctx, &budget.Reservation{Tokens: budget.WithAmount([]budget.Charge{bucket(budget.Client, fmt.Sprint("2001:db8:", i, "::/64")), alice}, 100)})
				Expect(err).NotTo(HaveOccurred())
				Expect(res.Shared).To(BeFalse())
				Expect(res.Admitted).To(BeTrue())
				Expect(res.TokenSkipped).To(Equal([]bool{i >= 2, false}), "client %d", i)
			}
			res, err := local.Reserve(ctx, &budget.Reservation{Tokens: budget.WithAmount([]budget.Charge{alice}, 101)})
			Expect(err).NotTo(HaveOccurred())
			Expect(res.Admitted).To(BeFalse(), "alice's share of 600 is down to 100")
		})

		It("follows a reload of fallback_to_memory", func() {
			mem := budget.NewMemory(storetest.NewClock(), 1000)
			local, err := redisstore.New(redisstore.Options{URL: "redis://127.0.0.1:1/0", DialTimeout: 50 * time.Millisecond,
				ReadTimeout: 50 * time.Millisecond, WriteTimeout: 50 * time.Millisecond, Fallback: mem})
			Expect(err).NotTo(HaveOccurred())
			DeferCleanup(local.Close)
			res, err := local.Reserve(ctx, everyDimension(1))
			Expect(err).NotTo(HaveOccurred())
			Expect(res.Backend).To(BeIdenticalTo(mem))
			local.SetFallback(nil)
			_, err = local.Reserve(ctx, everyDimension(1))
			var ue *budget.UnavailableError
			Expect(err).To(BeAssignableToTypeOf(ue), "fallback_to_memory: false fails closed")
			local.SetFallback(mem)
			res, err = local.Reserve(ctx, everyDimension(1))
			Expect(err).NotTo(HaveOccurred())
			Expect(res.Backend).To(BeIdenticalTo(mem))
		})

		It("fails closed when there is no fallback", func() {
			u := &unavailable{counts: map[string]int{}}
			local, err := redisstore.New(redisstore.Options{URL: "redis://127.0.0.1:1/0", DialTimeout: 50 * time.Millisecond,
				ReadTimeout: 50 * time.Millisecond, WriteTimeout: 50 * time.Millisecond, Recorder: recorder{u: u}})
			Expect(err).NotTo(HaveOccurred())
			DeferCleanup(local.Close)
			_, err = local.Reserve(ctx, everyDimension(1))
			var ue *budget.UnavailableError
			Expect(err).To(BeAssignableToTypeOf(ue))
			Expect(u.counts["api_key/fail_closed"]).To(Equal(1))
		})

		It("honours the timeouts when Redis stalls, and returns to Redis when it answers again", func() {
			// Timeouts long enough that a loaded machine cannot blur "one timeout" with
			// "two", or "no wait" with "one timeout".
			const timeout = 500 * time.Millisecond
			own := redisserver.Start(GinkgoT())
			clock := storetest.NewClock()
			mem := budget.NewMemory(clock, 1000)
			s, err := redisstore.New(redisstore.Options{URL: own.URL(), DialTimeout: timeout,
				ReadTimeout: timeout, WriteTimeout: timeout, Fallback: mem, Backoff: 2 * time.Second})
			Expect(err).NotTo(HaveOccurred())
			DeferCleanup(s.Close)
			res, err := s.Reserve(ctx, everyDimension(1))
			Expect(err).NotTo(HaveOccurred())
			Expect(res.Shared).To(BeTrue())

			Expect(own.Pause()).To(Succeed())
			start := time.Now()
			res, err = s.Reserve(ctx, everyDimension(1))
			Expect(err).NotTo(HaveOccurred())
			Expect(res.Shared).To(BeFalse())
			took := time.Since(start)
			Expect(took).To(BeNumerically(">=", timeout), "it waited for Redis")
			Expect(took).To(BeNumerically("<", 2*timeout), "a stalled Redis costs the read timeout once, not a retry")
			start = time.Now()
			res, _ = s.Reserve(ctx, everyDimension(1))
			Expect(res.Shared).To(BeFalse())
			Expect(time.Since(start)).To(BeNumerically("<", timeout/2), "while marked down, admission does not wait on Redis")

			Expect(own.Resume()).To(Succeed())
			Eventually(func() bool {
				res, err := s.Reserve(ctx, everyDimension(1))
				return err == nil && res.Shared
			}, 30*time.Second, 50*time.Millisecond).Should(BeTrue())

			Expect(own.Restart()).To(Succeed())
			Eventually(func() bool {
				res, err := s.Reserve(ctx, everyDimension(1))
				return err == nil && res.Shared
			}, 30*time.Second, 50*time.Millisecond).Should(BeTrue(), "back on a restarted, empty Redis (the script is loaded again)")
		})
	})
})

// skewed is a replica's clock that runs off the real time by a fixed offset.
type skewed time.Duration

func (s skewed) Now() time.Time { return time.Now().Add(time.Duration(s)) }

var _ = Describe("Shared buckets and replica clocks", func() {
	ctx := context.Background()

	It("never credits two replicas' clock skew as refill", func() {
		prefix := fmt.Sprintf("skew%d", prefixes.Add(1))
		replica := func(offset time.Duration) *redisstore.Store {
			s, err := redisstore.New(redisstore.Options{URL: srv.URL(), Prefix: prefix,
				DialTimeout: time.Second, ReadTimeout: time.Second, WriteTimeout: time.Second, Clock: skewed(offset)})
			Expect(err).NotTo(HaveOccurred())
			DeferCleanup(s.Close)
			return s
		}
		ahead, behind := replica(30*time.Second), replica(-30*time.Second)
		// 600 tokens a minute: 10 a second. The two clocks are a minute apart, so a
		// bucket that took each replica's clock in turn would refill whole at every turn.
		m := budget.Charge{Key: budget.Key{Kind: budget.TokensMinute, Dim: budget.Team, ID: "research"}, SharedCapacity: 600, SharedRate: 10}
		start := time.Now()
		admitted := 0
		for i := 0; i < 20; i++ {
			s := []*redisstore.Store{ahead, behind}[i%2]
			res, err := s.Reserve(ctx, &budget.Reservation{Tokens: budget.WithAmount([]budget.Charge{m}, 100)})
			Expect(err).NotTo(HaveOccurred())
			Expect(res.Shared).To(BeTrue())
			if res.Admitted {
				admitted += 100
			}
		}
		refilled := 10 * time.Since(start).Seconds()
		Expect(float64(admitted)).To(BeNumerically("<=", 600+refilled), "the bucket's 600 and what the real time refilled, no more")
		l, ok, err := ahead.Level(ctx, m.Key)
		Expect(err).NotTo(HaveOccurred())
		Expect(ok).To(BeTrue())
		Expect(l).To(BeNumerically("<=", 600-float64(admitted)+10*time.Since(start).Seconds()))
	})
})
