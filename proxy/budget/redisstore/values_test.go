// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package redisstore_test

import (
	"context"
	"fmt"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/proxy/budget/redisstore"
	"github.com/tokenwarden/tokenwarden/proxy/budget/storetest"
	"github.com/tokenwarden/tokenwarden/proxy/metrics"
)

var _ = Describe("Client-supplied values in Redis", func() {
	It("counts a key's values beyond max_attribute_values in one overflow subject, so a client cannot fill Redis", func() {
		// A prefix of its own: the suite's other stores share the server and count by
		// sessions too, and the spec lists every key of its store.
		s, err := redisstore.New(redisstore.Options{URL: srv.URL(), Prefix: "values-bound", Clock: storetest.NewClock()})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(s.Close)
		m := metrics.New(prometheus.NewRegistry())
		l := budget.NewLimiter(s, m, budget.SystemClock{}, false)
		p := redisPolicy(`
  - {name: each-session, dimension: api_key, count_by: session, amount: requests, windows: [{limit: 1, rolling: {period: hour}}]}
  max_attribute_values: 3
`)
		send := func(key, session string) bool {
			GinkgoHelper()
			dec, err := l.Admit(context.Background(), p, budget.Identity{Key: p.Key(key), Session: session}, budget.Ask{})
			Expect(err).NotTo(HaveOccurred())
			return dec.Refusal == nil
		}
		for i := range 3 {
			Expect(send("alice", fmt.Sprintf("s-%d", i))).To(BeTrue(), "session %d has a counter of its own", i)
		}
		Expect(send("alice", "s-0")).To(BeFalse(), "its one request an hour is spent")
		Expect(send("alice", "s-3")).To(BeTrue(), "the first value beyond the bound takes the overflow subject's one request")
		for i := 4; i < 100; i++ {
			Expect(send("alice", fmt.Sprintf("s-%d", i))).To(BeFalse(), "every later new value shares the overflow subject")
		}
		Expect(send("bob", "s-50")).To(BeTrue(), "bob's values are bounded apart")
		Expect(testutil.ToFloat64(m.RuleOverflow.WithLabelValues("each-session", "hour"))).To(Equal(97.0))

		keys, err := s.Client().Keys(context.Background(), "*values-bound*each-session*").Result()
		Expect(err).NotTo(HaveOccurred())
		var counters, sets []string
		for _, k := range keys {
			if strings.Contains(k, ":values:") {
				sets = append(sets, k)
			} else {
				counters = append(counters, k)
			}
		}
		Expect(counters).To(HaveLen(5), "alice's 3 sessions and her overflow subject, and bob's session: %v", counters)
		Expect(sets).To(HaveLen(2), "one set of values per key")
		for _, k := range sets {
			n, err := s.Client().SCard(context.Background(), k).Result()
			Expect(err).NotTo(HaveOccurred())
			Expect(n).To(BeNumerically("<=", 3))
			ttl, err := s.Client().PTTL(context.Background(), k).Result()
			Expect(err).NotTo(HaveOccurred())
			Expect(ttl).To(BeNumerically(">", 0), "the set expires after its window")
		}
	})
})
