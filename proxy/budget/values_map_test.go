// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package budget_test

import (
	"context"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/proxy/metrics"
)

var _ = Describe("The buckets of client-supplied values", func() {
	It("live in a map of their own; once it is full, a value seen before counts in its key's overflow subject, never failing open", func() {
		r := newRig(rulesPolicy(`  max_attribute_values: 100
  rules:
  - {name: each-session, dimension: team, count_by: session, amount: requests, windows: [{limit: 2, rolling: {period: minute}}]}
  - {name: team, dimension: team, amount: requests, windows: [{limit: 100, rolling: {period: minute}}]}
`))
		reg := prometheus.NewRegistry()
		m := metrics.New(reg)
		r.l = budget.NewLimiter(r.mem, m, r.clock, false)
		r.mem.SetMaxBuckets(4)
		send := func(key, session string) bool {
			GinkgoHelper()
			dec, err := r.l.Admit(context.Background(), r.p, budget.Identity{Key: r.p.Key(key), Session: session}, budget.Ask{})
			Expect(err).NotTo(HaveOccurred())
			return dec.Refusal == nil
		}
		Expect(send("alice", "s-1")).To(BeTrue())
		Expect(send("amir", "a-1")).To(BeTrue())
		Expect(send("amir", "a-2")).To(BeTrue())
		Expect(send("amir", "a-3")).To(BeTrue())
		Expect(r.mem.ValueBuckets()).To(Equal(int64(4)))
		Expect(r.mem.LenOf(budget.Team, budget.Rolling)).To(Equal(int64(1)), "research's own counter, apart from the values'")

		r.clock.Advance(31 * time.Second) // within the minute: s-1 stays among alice's values
		r.mem.Sweep()
		Expect(r.mem.ValueBuckets()).To(BeZero(), "each refilled")
		for _, s := range []string{"b-1", "b-2", "b-3", "b-4"} {
			Expect(send("bob", s)).To(BeTrue())
		}
		Expect(send("bob", "b-5")).To(BeTrue(), "the map is full: bob's new value is his overflow subject's")
		Expect(r.mem.ValueBuckets()).To(Equal(int64(4)))

		Expect(send("alice", "s-1")).To(BeTrue())
		Expect(send("alice", "s-1")).To(BeTrue())
		Expect(send("alice", "s-1")).To(BeFalse(), "s-1 has no room for a bucket: it counts in alice's overflow subject, two a minute")
		Expect(testutil.ToFloat64(m.RuleOverflow.WithLabelValues("each-session", "minute"))).To(Equal(4.0),
			"bob's b-5 and alice's three of s-1, counted")
		level, ok := r.mem.Level(budget.Key{Kind: budget.Rolling, Dim: budget.Team, ID: "research", Rule: "each-session",
			By: "alice/" + budget.Overflow})
		Expect(ok).To(BeTrue())
		Expect(level).To(BeNumerically("<", 1))
		Expect(r.mem.LenOf(budget.Team, budget.Rolling)).To(Equal(int64(4)), "two teams' counters and two keys' overflow subjects")
	})
})
