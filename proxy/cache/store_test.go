// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package cache_test

import (
	"context"
	"fmt"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/redis/go-redis/v9"

	"github.com/tokenwarden/tokenwarden/proxy/cache"
	"github.com/tokenwarden/tokenwarden/proxy/usage"
	"github.com/tokenwarden/tokenwarden/test/redisserver"
)

const ttl = 5 * time.Minute

func keyOf(scope, model, body string) cache.Key {
	r := baseRequest()
	r.Scope, r.Model, r.Body = scope, model, []byte(body)
	return r.Key()
}

func entryAt(c *clock, body string) cache.Entry {
	return cache.Entry{
		Status: 200, ContentType: "application/json", Body: []byte(body),
		Usage: usage.Usage{Input: 100, Output: 20, Cached: 4, Found: true}, Stored: c.Now(),
	}
}

func streamAt(c *clock, events ...string) cache.Entry {
	e := cache.Entry{Status: 200, ContentType: "text/event-stream", Events: []int32{}, Stored: c.Now()}
	for _, ev := range events {
		e.Body = append(e.Body, ev...)
		e.Events = append(e.Events, int32(len(e.Body)))
	}
	return e
}

// storeSpecs is the behaviour every cache.Store has; newStore builds an empty one on
// the clock.
func storeSpecs(newStore func(c *clock) cache.Store) {
	var (
		c   *clock
		s   cache.Store
		ctx = context.Background()
	)
	BeforeEach(func() {
		c = newClock()
		s = newStore(c)
	})

	It("answers what was stored under the same key, and nothing under another", func() {
		k := keyOf("key:alice", "m", "a")
		s.Put(ctx, k, entryAt(c, `{"answer":1}`))
		e, ok := s.Get(ctx, k)
		Expect(ok).To(BeTrue())
		Expect(string(e.Body)).To(Equal(`{"answer":1}`))
		Expect(e.Status).To(Equal(200))
		Expect(e.ContentType).To(Equal("application/json"))
		Expect(e.Usage).To(Equal(usage.Usage{Input: 100, Output: 20, Cached: 4, Found: true}))
		Expect(e.Stored.Equal(c.Now())).To(BeTrue())

		_, ok = s.Get(ctx, keyOf("key:mallory", "m", "a"))
		Expect(ok).To(BeFalse(), "another key's request with the same body")
		_, ok = s.Get(ctx, keyOf("key:alice", "m2", "a"))
		Expect(ok).To(BeFalse(), "another model")
	})

	It("keeps a stream's events", func() {
		k := keyOf("key:alice", "m", "s")
		s.Put(ctx, k, streamAt(c, "data: 1\n\n", "data: 2\n\n"))
		e, ok := s.Get(ctx, k)
		Expect(ok).To(BeTrue())
		var got []string
		Expect(e.EachEvent(func(p []byte) error { got = append(got, string(p)); return nil })).To(Succeed())
		Expect(got).To(Equal([]string{"data: 1\n\n", "data: 2\n\n"}))
	})

	It("misses an entry once its time to live has passed, on the injected clock", func() {
		k := keyOf("key:alice", "m", "a")
		s.Put(ctx, k, entryAt(c, "x"))
		c.Advance(ttl - time.Second)
		e, ok := s.Get(ctx, k)
		Expect(ok).To(BeTrue())
		Expect(e.Age(c.Now())).To(Equal(int64((ttl - time.Second) / time.Second)))
		c.Advance(time.Second)
		_, ok = s.Get(ctx, k)
		Expect(ok).To(BeFalse())
		Expect(s.Stats().Expired).To(BeNumerically(">=", 1))
	})

	It("replaces an entry stored again under its key", func() {
		k := keyOf("key:alice", "m", "a")
		s.Put(ctx, k, entryAt(c, "old"))
		s.Put(ctx, k, entryAt(c, "new"))
		e, _ := s.Get(ctx, k)
		Expect(string(e.Body)).To(Equal("new"))
	})

	It("purges by scope, by model, or both, and leaves the rest", func() {
		keys := map[string]cache.Key{}
		for _, scope := range []string{"key:alice", "key:bob"} {
			for _, model := range []string{"m1", "m2"} {
				k := keyOf(scope, model, "a")
				keys[scope+"/"+model] = k
				s.Put(ctx, k, entryAt(c, scope+model))
			}
		}
		has := func(name string) bool { _, ok := s.Get(ctx, keys[name]); return ok }

		n, err := s.Purge(ctx, cache.Match{Scope: "key:alice", Model: "m1"})
		Expect(err).NotTo(HaveOccurred())
		Expect(n).To(Equal(1))
		Expect(has("key:alice/m1")).To(BeFalse())
		Expect(has("key:alice/m2")).To(BeTrue())

		n, err = s.Purge(ctx, cache.Match{Model: "m2"})
		Expect(err).NotTo(HaveOccurred())
		Expect(n).To(Equal(2))
		Expect(has("key:bob/m1")).To(BeTrue())

		n, err = s.Purge(ctx, cache.Match{Scope: "key:bob"})
		Expect(err).NotTo(HaveOccurred())
		Expect(n).To(Equal(1))
		Expect(has("key:bob/m1")).To(BeFalse())
	})
}

var _ = Describe("The memory store", func() {
	storeSpecs(func(c *clock) cache.Store { return cache.NewMemory(c, ttl, 1<<20) })

	It("drops the least recently used entries to stay within its bytes", func() {
		c := newClock()
		ctx := context.Background()
		one := entryAt(c, strings.Repeat("x", 1000))
		s := cache.NewMemory(c, ttl, 3*1300)
		for i := range 3 {
			s.Put(ctx, keyOf("key:a", "m", fmt.Sprint(i)), one)
		}
		Expect(s.Stats().Entries).To(Equal(int64(3)))
		_, _ = s.Get(ctx, keyOf("key:a", "m", "0")) // 0 is now the most recently used
		s.Put(ctx, keyOf("key:a", "m", "3"), one)
		_, ok := s.Get(ctx, keyOf("key:a", "m", "1"))
		Expect(ok).To(BeFalse(), "the least recently used entry was dropped")
		_, ok = s.Get(ctx, keyOf("key:a", "m", "0"))
		Expect(ok).To(BeTrue())
		st := s.Stats()
		Expect(st.Evictions).To(Equal(int64(1)))
		Expect(st.Bytes).To(BeNumerically("<=", 3*1300))
	})

	It("never holds more than its bytes, however many distinct answers are stored", func() {
		c := newClock()
		ctx := context.Background()
		const limit = 64 << 10
		s := cache.NewMemory(c, ttl, limit)
		for i := range 5000 {
			s.Put(ctx, keyOf("key:attacker", "m", fmt.Sprint(i)), entryAt(c, strings.Repeat("y", i%900)))
			Expect(s.Stats().Bytes).To(BeNumerically("<=", limit))
		}
		Expect(s.Stats().Evictions).To(BeNumerically(">", 4000))
	})

	It("does not keep an entry larger than the whole store, nor drop others for it", func() {
		c := newClock()
		ctx := context.Background()
		s := cache.NewMemory(c, ttl, 4096)
		s.Put(ctx, keyOf("key:a", "m", "small"), entryAt(c, "small"))
		s.Put(ctx, keyOf("key:a", "m", "huge"), entryAt(c, strings.Repeat("z", 8192)))
		_, ok := s.Get(ctx, keyOf("key:a", "m", "huge"))
		Expect(ok).To(BeFalse())
		_, ok = s.Get(ctx, keyOf("key:a", "m", "small"))
		Expect(ok).To(BeTrue())
	})
})

var _ = Describe("The Redis store", func() {
	var srv *redisserver.Server
	var clients []redis.UniversalClient
	newRedis := func(c *clock) *cache.Redis {
		rc, err := cache.NewRedisClient(srv.URL(), "", 200*time.Millisecond)
		Expect(err).NotTo(HaveOccurred())
		clients = append(clients, rc)
		return cache.NewRedis(cache.RedisOptions{Client: rc, Clock: c, TTL: ttl, Timeout: 200 * time.Millisecond})
	}
	BeforeEach(func() {
		srv = redisserver.Start(GinkgoT())
		DeferCleanup(func() {
			for _, c := range clients {
				_ = c.Close()
			}
			clients = nil
		})
	})

	storeSpecs(func(c *clock) cache.Store { return newRedis(c) })

	It("is shared: one replica's answer is another's hit", func() {
		c := newClock()
		ctx := context.Background()
		a, b := newRedis(c), newRedis(c)
		k := keyOf("key:alice", "m", "a")
		a.Put(ctx, k, entryAt(c, "from a"))
		e, ok := b.Get(ctx, k)
		Expect(ok).To(BeTrue())
		Expect(string(e.Body)).To(Equal("from a"))
	})

	It("reads an outage as misses and loses writes without an error, then serves again", func() {
		c := newClock()
		ctx := context.Background()
		s := newRedis(c)
		k := keyOf("key:alice", "m", "a")
		s.Put(ctx, k, entryAt(c, "before"))
		Expect(srv.Kill()).To(Succeed())
		_, ok := s.Get(ctx, k)
		Expect(ok).To(BeFalse())
		s.Put(ctx, k, entryAt(c, "during"))
		_, err := s.Purge(ctx, cache.Match{Scope: "key:alice"})
		Expect(err).To(HaveOccurred(), "a purge says it failed")
		Expect(s.Stats().Errors).To(BeNumerically(">=", 2))

		Expect(srv.Restart()).To(Succeed())
		Eventually(func() bool {
			s.Put(ctx, k, entryAt(c, "after"))
			_, ok := s.Get(ctx, k)
			return ok
		}).Should(BeTrue())
	})

	It("bounds a call to a stalled Redis by its timeout", func() {
		c := newClock()
		ctx := context.Background()
		s := newRedis(c)
		k := keyOf("key:alice", "m", "a")
		s.Put(ctx, k, entryAt(c, "x"))
		Expect(srv.Pause()).To(Succeed())
		DeferCleanup(srv.Resume)
		start := time.Now()
		_, ok := s.Get(ctx, k)
		Expect(ok).To(BeFalse())
		Expect(time.Since(start)).To(BeNumerically("<", 2*time.Second))
	})

	It("reads an entry that does not decode as a miss", func() {
		c := newClock()
		ctx := context.Background()
		s := newRedis(c)
		k := keyOf("key:alice", "m", "a")
		s.Put(ctx, k, entryAt(c, "x"))
		rc := redis.NewClient(&redis.Options{Addr: srv.Addr()})
		defer rc.Close()
		names, err := rc.Keys(ctx, "*"+k.String()).Result()
		Expect(err).NotTo(HaveOccurred())
		Expect(names).To(HaveLen(1))
		Expect(names[0]).NotTo(ContainSubstring("alice"), "key names hold no identities")
		for _, bad := range []string{"", "\x01", "\x02garbage", "\x01\xc8\x01"} {
			Expect(rc.Set(ctx, names[0], bad, 0).Err()).To(Succeed())
			_, ok := s.Get(ctx, k)
			Expect(ok).To(BeFalse(), "%q", bad)
		}
	})

	It("lets Redis expire an entry after the time to live", func() {
		c := newClock()
		ctx := context.Background()
		s := newRedis(c)
		k := keyOf("key:alice", "m", "a")
		s.Put(ctx, k, entryAt(c, "x"))
		rc := redis.NewClient(&redis.Options{Addr: srv.Addr()})
		defer rc.Close()
		names, _ := rc.Keys(ctx, "*").Result()
		Expect(names).To(HaveLen(1))
		left, err := rc.PTTL(ctx, names[0]).Result()
		Expect(err).NotTo(HaveOccurred())
		Expect(left).To(BeNumerically("~", ttl, time.Second))
	})
})
