// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package server_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http/httptest"

	"sync"
	"sync/atomic"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/proxy/budget/redisstore"
	"github.com/tokenwarden/tokenwarden/proxy/metrics"
	"github.com/tokenwarden/tokenwarden/proxy/server"
	"github.com/tokenwarden/tokenwarden/test/redisserver"
)

// redisProxy is one more proxy replica on the shared Redis, in front of h's backend.
type redisProxy struct {
	srv   *server.Server
	store *redisstore.Store
	mem   *budget.Memory
	m     *metrics.Metrics
	url   string
}

func newRedisProxy(h *harness, redisURL, prefix string, fallback bool, doc string) *redisProxy {
	return newRedisProxyWith(h, redisURL, prefix, fallback, doc, redisstore.CheckOptions{})
}

// newRedisProxyWith is newRedisProxy with the store checks of checks.
func newRedisProxyWith(h *harness, redisURL, prefix string, fallback bool, doc string, checks redisstore.CheckOptions) *redisProxy {
	return newRedisProxyOpts(h, redisURL, prefix, fallback, doc, checks, server.Options{})
}

// newRedisProxyOpts is newRedisProxyWith whose server also has extra's options.
func newRedisProxyOpts(h *harness, redisURL, prefix string, fallback bool, doc string, checks redisstore.CheckOptions, extra server.Options) *redisProxy {
	return startRedisProxy(h, redisstore.Options{URL: redisURL, Prefix: prefix, Checks: checks,
		DialTimeout: 100 * time.Millisecond, ReadTimeout: 100 * time.Millisecond, WriteTimeout: 100 * time.Millisecond,
		Backoff: 200 * time.Millisecond}, fallback, doc, extra)
}

// startRedisProxy is a proxy on the Redis and with the timeouts of opts, settling off
// the request's goroutine as the binary does, its memory the store's fallback when
// fallback is set, and its server with extra's options besides; it serves doc.
func startRedisProxy(h *harness, opts redisstore.Options, fallback bool, doc string, extra server.Options) *redisProxy {
	p := &redisProxy{m: metrics.New(prometheus.NewRegistry()), mem: budget.NewMemory(h.clock, 1000)}
	opts.Recorder, opts.Logger = p.m, slog.New(slog.NewTextHandler(GinkgoWriter, nil))
	if fallback {
		opts.Fallback = p.mem
	}
	var err error
	p.store, err = redisstore.New(opts)
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(p.store.Close)
	so := extra
	so.Store, so.Memory, so.Metrics, so.Clock, so.AsyncSettle = p.store, p.mem, p.m, h.clock, true
	so.Logger = opts.Logger
	p.srv = server.New(so)
	_, err = p.srv.Apply([]byte(h.render(doc)), "test")
	Expect(err).NotTo(HaveOccurred())
	front := httptest.NewServer(p.srv)
	DeferCleanup(front.Close)
	p.url = front.URL
	return p
}

// via sends h's chat request to another proxy.
func via(h *harness, url string) func(key string, maxTokens int) reply {
	return func(key string, maxTokens int) reply { return h.chatAt(url, key, maxTokens) }
}

var redisPrefixes atomic.Int64

func redisDoc(url string, fallback bool, team string) string {
	return fmt.Sprintf(`
upstreams: [{name: default, url: UPSTREAM}]
api_keys:
- {name: alice, key_sha256: HASH(alice), user: alice, team: research}
- {name: bob, key_sha256: HASH(bob), user: bob, team: research}
rate_limiting:
  storage: redis
  redis: {url: "%s", fallback_to_memory: %v}
  budget_division: {replicas: 2}
  limits:
    per_team: {tokens_per_minute: %s}
`, url, fallback, team)
}

var _ = Describe("A fleet on one Redis", func() {
	var redis *redisserver.Server
	BeforeEach(func() { redis = redisserver.Start(GinkgoT()) })

	It("enforces one total across two proxies, without dividing it", func() {
		h := newHarness(keysDoc)
		prefix := fmt.Sprintf("fleet%d", redisPrefixes.Add(1))
		doc := redisDoc(redis.URL(), true, "1080")
		a := via(h, newRedisProxy(h, redis.URL(), prefix, true, doc).url)
		b := via(h, newRedisProxy(h, redis.URL(), prefix, true, doc).url)
		h.llm.Set(fakellmUsage(100, 8)) // each request settles at 108 of its 108
		admitted := 0
		for i := 0; i < 10; i++ {
			send := a
			if i%2 == 1 {
				send = b
			}
			r := send("sk-alice", 108-chatInput)
			Expect(r.code).To(Equal(200), "request %d of 10 fits the fleet total of 1080", i)
			Expect(r.header.Get("X-Ratelimit-Tokens-Limit")).To(BeEmpty(), "team is a shared dimension")
			admitted++
		}
		Expect(a("sk-bob", 100).code).To(Equal(429), "the 11th request, on either proxy, does not fit")
		Expect(b("sk-bob", 100).code).To(Equal(429))
	})

	It("keeps serving within the replica's share when Redis dies under load, and returns to Redis", func() {
		h := newHarness(keysDoc)
		h.llm.Set(fakellmZeroUsage(20 * time.Millisecond))
		p := newRedisProxy(h, redis.URL(), fmt.Sprintf("fleet%d", redisPrefixes.Add(1)), true, redisDoc(redis.URL(), true, "100000"))
		send := via(h, p.url)

		var codes sync.Map
		var wg sync.WaitGroup
		stop := make(chan struct{})
		for w := 0; w < 8; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer GinkgoRecover()
				for {
					select {
					case <-stop:
						return
					default:
					}
					c := send("sk-alice", 100).code
					n, _ := codes.LoadOrStore(c, new(atomic.Int64))
					n.(*atomic.Int64).Add(1)
				}
			}()
		}
		time.Sleep(300 * time.Millisecond)
		Expect(redis.Kill()).To(Succeed())
		time.Sleep(500 * time.Millisecond)
		Expect(redis.Restart()).To(Succeed())
		time.Sleep(700 * time.Millisecond)
		close(stop)
		wg.Wait()

		codes.Range(func(k, _ any) bool {
			Expect(k).To(Equal(200), "every request was answered while Redis died and came back")
			return true
		})
		Expect(counterValue(p.m.RedisUnavailableVec.WithLabelValues("team", "fallback_memory"))).To(BeNumerically(">", 0))
		// No hold leaked: every request's hold was refunded whole, on the backend that took it.
		Eventually(func() float64 {
			l, ok := p.mem.Level(budget.Key{Kind: budget.TokensMinute, Dim: budget.Team, ID: "research"})
			if !ok {
				return 50000
			}
			return l
		}).Should(BeNumerically("~", 50000, 0.01), "the fallback bucket holds the divided share, 100000 / 2, whole again")
		probe := &budget.Reservation{Tokens: []budget.Charge{{Key: budget.Key{Kind: budget.TokensMinute, Dim: budget.Global}, SharedCapacity: 1, SharedRate: 1}}}
		Eventually(func() bool {
			res, err := p.store.Reserve(context.Background(), probe)
			return err == nil && res.Shared
		}).Should(BeTrue(), "the proxy is back on Redis")
		Eventually(func() float64 {
			l, ok, err := p.store.Level(context.Background(), budget.Key{Kind: budget.TokensMinute, Dim: budget.Team, ID: "research"})
			Expect(err).NotTo(HaveOccurred())
			if !ok {
				return 100000
			}
			return l
		}).Should(BeNumerically("~", 100000, 0.01), "the shared bucket is whole again too")
	})

	It("answers 503 with Retry-After: 5 when Redis is down and the config fails closed", func() {
		h := newHarness(keysDoc)
		p := newRedisProxy(h, redis.URL(), fmt.Sprintf("fleet%d", redisPrefixes.Add(1)), false, redisDoc(redis.URL(), false, "100000"))
		send := via(h, p.url)
		Expect(send("sk-alice", 100).code).To(Equal(200))
		Expect(redis.Kill()).To(Succeed())
		r := send("sk-alice", 100)
		Expect(r.code).To(Equal(503))
		Expect(r.header.Get("Retry-After")).To(Equal("5"))
		Expect(r.errorField("error", "code")).To(Equal("budget_store_unavailable"))
		Expect(counterValue(p.m.RedisUnavailableVec.WithLabelValues("team", "fail_closed"))).To(BeNumerically(">=", 1))
		Expect(redis.Restart()).To(Succeed())
		Eventually(func() int { return send("sk-alice", 100).code }, 3*time.Second, 50*time.Millisecond).Should(Equal(200))
	})
})

func counterValue(c prometheus.Collector) float64 { return counter(c) }
