// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package redisstore_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/redis/go-redis/v9"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/proxy/budget/redisstore"
	"github.com/tokenwarden/tokenwarden/proxy/config"
)

// floodPolicy counts by session under the key and under its team, by day and by
// request fingerprint, with the bound given; alice and amir are team research's. Its
// windows are long enough that no counter refills and expires while a spec runs (a
// counter of 1 of 20 requests a minute is full again, and gone, in 3 s).
func floodPolicy(url string, bound int) *budget.Policy {
	GinkgoHelper()
	c, err := config.Parse(fmt.Appendf(nil, `
upstreams: [{name: default, url: "http://127.0.0.1:1"}]
api_keys:
- {name: alice, team: research, key_sha256: "%064x"}
- {name: amir, team: research, key_sha256: "%064x"}
rate_limiting:
  storage: redis
  redis: {url: "%s"}
  max_attribute_values: %d
  rules:
  - {name: each-session, dimension: api_key, count_by: session, amount: requests, windows: [{limit: 5, rolling: {period: hour}}]}
  - {name: team-session, dimension: team, count_by: session, amount: tokens, windows: [{limit: 10000, rolling: {period: day}}]}
  - {name: daily, dimension: api_key, count_by: session, amount: requests, windows: [{limit: 50, calendar: {every: day}}]}
  - {name: identical, dimension: api_key, count_by: request_fingerprint, amount: requests, windows: [{limit: 20, rolling: {period: day}}]}
`, 1, 2, url, bound))
	Expect(err).NotTo(HaveOccurred())
	return budget.NewPolicy(c)
}

// keysOf lists every key of a store's prefix, on every master.
func keysOf(s *redisstore.Store, prefix string) []string {
	GinkgoHelper()
	var mu sync.Mutex
	var out []string
	Expect(masters(s, func(c redis.Cmdable) error {
		ks, err := c.Keys(context.Background(), "*"+prefix+"*").Result()
		mu.Lock()
		out = append(out, ks...)
		mu.Unlock()
		return err
	})).To(Succeed())
	return out
}

// flood sends 10,000 requests, each with a new session id and body, over two
// keys, and checks what Redis holds after.
func flood(url, prefix string) {
	GinkgoHelper()
	s := fleetStore(url, prefix, nil)
	p := floodPolicy(url, 100)
	l := budget.NewLimiter(s, budget.NopRecorder{}, budget.SystemClock{}, false)
	// Ids a client may send (visible ASCII): braces, a glob, colons and the '@' of a
	// calendar counter's start, so none may move a counter to another slot, pattern
	// or window.
	id := func(i int) string { return fmt.Sprintf("{s}*:%d@1:[x]/%d", i, i) }
	var next, admitted atomic.Int64
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			defer GinkgoRecover()
			for i := int(next.Add(1)); i <= 10000; i = int(next.Add(1)) {
				key := []string{"alice", "amir"}[i%2]
				dec, err := l.Admit(context.Background(), p, budget.Identity{Key: p.Key(key), Session: id(i), Fingerprint: fmt.Sprintf("%064x", i)},
					budget.Ask{Input: 10, Output: 10})
				Expect(err).NotTo(HaveOccurred())
				if dec.Refusal == nil {
					admitted.Add(1)
					dec.Hold.Settle(budget.Used{Input: 10, Output: 5})
				}
			}
		})
	}
	wg.Wait()

	keys := keysOf(s, prefix)
	var counters, sets int
	for _, k := range keys {
		ttl, err := s.Client().PTTL(context.Background(), k).Result()
		Expect(err).NotTo(HaveOccurred())
		if strings.HasSuffix(k, ":epoch") {
			continue // the fleet's one epoch key a slot group, not a client's
		}
		Expect(ttl).To(BeNumerically(">", 0), "%s expires", k)
		switch {
		case strings.Contains(k, ":values:"):
			sets++
			n, err := s.Client().SCard(context.Background(), k).Result()
			Expect(err).NotTo(HaveOccurred())
			Expect(n).To(BeNumerically("<=", 100), "%s holds at most the bound", k)
		case strings.Contains(k, ":rule:"):
			counters++
		}
	}
	// Each of the 4 rules, for each of the 2 keys: 100 values and the overflow subject.
	Expect(sets).To(Equal(8), "a set per rule window and key")
	Expect(counters).To(Equal(4*2*101), "10,000 ids make 100 counters a rule and key, and the overflow subject")
	Expect(admitted.Load()).To(BeNumerically("<=", 2*(100+5)), "the overflow subject holds every later id to its 5 an hour")
}

var _ = Describe("A client flooding Redis with new session ids and bodies", func() {
	It("leaves as many counters as the bound, each expiring, on one server", func() {
		flood(srv.URL(), fmt.Sprintf("flood%d", prefixes.Add(1)))
	})
	It("leaves as many counters as the bound, each expiring, on a cluster", func() {
		flood(cluster.URL(), fmt.Sprintf("flood%d", prefixes.Add(1)))
	})
})

var _ = Describe("The bound on a key's values across three proxies on one Redis", func() {
	It("admits the bound's values fleet-wide, sent at once to three, and a value admitted before it filled stays its own after", func() {
		prefix := fmt.Sprintf("three%d", prefixes.Add(1))
		p := floodPolicy(srv.URL(), 50)
		var ls []*budget.Limiter
		var stores []*redisstore.Store
		for range 3 {
			stores = append(stores, fleetStore(srv.URL(), prefix, nil))
			ls = append(ls, budget.NewLimiter(stores[len(stores)-1], budget.NopRecorder{}, budget.SystemClock{}, false))
		}
		send := func(l *budget.Limiter, session string) bool {
			dec, err := l.Admit(context.Background(), p, budget.Identity{Key: p.Key("alice"), Session: session, Fingerprint: session}, budget.Ask{})
			Expect(err).NotTo(HaveOccurred())
			return dec.Refusal == nil
		}
		// Ten clients on each proxy, each sending its share of 600 new ids.
		var wg sync.WaitGroup
		var next, admitted atomic.Int64
		for c := range 30 {
			wg.Go(func() {
				defer GinkgoRecover()
				for i := int(next.Add(1)); i <= 600; i = int(next.Add(1)) {
					if send(ls[c%3], fmt.Sprintf("s-%d", i)) {
						admitted.Add(1)
					}
				}
			})
		}
		wg.Wait()
		// Every id (and body) is new: 50 have counters of their own, and the other 550
		// share the overflow subject's 5 an hour.
		Expect(admitted.Load()).To(Equal(int64(55)), "50 values of their own and 5 in the overflow subject, not 3 replicas' bounds")

		var sets []string
		for _, k := range keysOf(stores[0], prefix) {
			if strings.Contains(k, ":values:each-session:") {
				sets = append(sets, k)
			}
		}
		Expect(sets).To(HaveLen(1))
		held, err := stores[0].Client().SMembers(context.Background(), sets[0]).Result()
		Expect(err).NotTo(HaveOccurred())
		Expect(held).To(HaveLen(50))
		for i, v := range held {
			Expect(send(ls[i%3], v)).To(BeTrue(), "%s, admitted before the bound filled, keeps a counter of its own", v)
		}
		Expect(send(ls[0], "s-new")).To(BeFalse(), "a new value is the overflow subject's, spent")
	})
})

var _ = Describe("A team's counters of client-supplied values", func() {
	collide := func(url string) {
		GinkgoHelper()
		s := fleetStore(url, fmt.Sprintf("collide%d", prefixes.Add(1)), nil)
		p := floodPolicy(url, 100)
		l := budget.NewLimiter(s, budget.NopRecorder{}, budget.SystemClock{}, false)
		// team-session holds 10,000 tokens an hour per (team, key, session): two asks of
		// 6,000 fit only in two counters.
		send := func(key, session string) bool {
			GinkgoHelper()
			dec, err := l.Admit(context.Background(), p, budget.Identity{Key: p.Key(key), Session: session, Fingerprint: key + session},
				budget.Ask{Input: 1000, Output: 5000})
			Expect(err).NotTo(HaveOccurred())
			return dec.Refusal == nil
		}
		Expect(send("amir", "s")).To(BeTrue())
		Expect(send("alice", "s")).To(BeTrue(), "alice's session s is not amir's")
		Expect(send("alice", "amir/s")).To(BeTrue(), "nor is alice's session amir/s: a key's name holds no '/'")
		Expect(send("alice", "amir/s")).To(BeFalse(), "alice's amir/s is her own counter, spent")
		Expect(send("amir", "s")).To(BeFalse())
	}
	It("keep each key's values apart, whatever a value spells, on one server", func() { collide(srv.URL()) })
	It("keep each key's values apart, whatever a value spells, on a cluster", func() { collide(cluster.URL()) })
})
