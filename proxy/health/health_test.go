// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package health_test

import (
	"net/http"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/tokenwarden/tokenwarden/proxy/health"
)

func TestHealth(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "Provider Health Suite")
}

var t0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

// calls records outcomes on a fresh breaker at t0: 'f' a failure, 's' a success,
// '4' a caller's mistake (a 4xx other than 429), which records as a success.
func calls(seq string) *health.Breaker {
	b := &health.Breaker{}
	for _, c := range seq {
		Expect(b.Allow(t0)).To(BeTrue(), "a closed breaker lets every call through")
		o := health.Success
		if c == 'f' {
			o = health.Failure
		}
		b.Record(t0, o)
	}
	return b
}

var _ = Describe("Breaker", func() {
	DescribeTable("opens after at least five recorded calls of which half or more failed",
		func(seq string, want health.State) {
			Expect(calls(seq).State(t0)).To(Equal(want))
		},
		Entry("four failures are too few calls to judge", "ffff", health.Closed),
		Entry("five failures of five open it", "fffff", health.Open),
		Entry("three failures of six are half: open", "sfsfsf", health.Open),
		Entry("two failures of five are fewer than half: closed", "sssff", health.Closed),
		Entry("caller mistakes never open it", "4444444444", health.Closed),
		Entry("caller mistakes between failures count as answers", "f44f44", health.Closed),
	)

	It("waits ten seconds, then lets three probes through, and three successes close it", func() {
		b := calls("fffff")
		Expect(b.Allow(t0.Add(9999 * time.Millisecond))).To(BeFalse())
		ok, at := b.Available(t0)
		Expect(ok).To(BeFalse())
		Expect(at).To(Equal(t0.Add(10 * time.Second)))
		now := t0.Add(10 * time.Second)
		Expect(b.State(now)).To(Equal(health.HalfOpen))
		for range 3 {
			Expect(b.Allow(now)).To(BeTrue())
		}
		Expect(b.Allow(now)).To(BeFalse(), "a fourth probe waits for the first three")
		for range 2 {
			Expect(b.Record(now, health.Success)).To(Equal(health.HalfOpen))
		}
		Expect(b.Record(now, health.Success)).To(Equal(health.Closed))
		Expect(b.Allow(now)).To(BeTrue())
	})

	It("opens again for ten seconds when a probe fails", func() {
		b := calls("fffff")
		now := t0.Add(10 * time.Second)
		Expect(b.Allow(now)).To(BeTrue())
		Expect(b.Record(now, health.Failure)).To(Equal(health.Open))
		Expect(b.Allow(now.Add(9 * time.Second))).To(BeFalse())
		Expect(b.Allow(now.Add(10 * time.Second))).To(BeTrue())
	})

	It("gives a probe that told nothing back to the next caller", func() {
		b := calls("fffff")
		now := t0.Add(10 * time.Second)
		for range 3 {
			Expect(b.Allow(now)).To(BeTrue())
		}
		b.Record(now, health.Unrecorded)
		Expect(b.Allow(now)).To(BeTrue())
	})
})

var _ = Describe("Cooldown timing", func() {
	h := func(kv ...string) http.Header {
		out := http.Header{}
		for i := 0; i < len(kv); i += 2 {
			out.Set(kv[i], kv[i+1])
		}
		return out
	}
	DescribeTable("reads the upstream's timing in the order of its headers, defaults and caps it",
		func(hdr http.Header, requested, applied time.Duration, src health.Source) {
			iv := health.CooldownFor(hdr, t0)
			Expect(iv.Requested).To(Equal(requested))
			Expect(iv.Applied).To(Equal(applied))
			Expect(iv.Source).To(Equal(src))
			Expect(iv.Clamped).To(Equal(requested > 5*time.Minute))
		},
		Entry("Retry-After in seconds", h("Retry-After", "7"), 7*time.Second, 7*time.Second, health.SourceRetryAfter),
		Entry("Retry-After as an HTTP date", h("Retry-After", t0.Add(42*time.Second).Format(http.TimeFormat)), 42*time.Second, 42*time.Second, health.SourceRetryAfter),
		Entry("Retry-After wins over retry-after-ms", h("Retry-After", "3", "Retry-After-Ms", "9000"), 3*time.Second, 3*time.Second, health.SourceRetryAfter),
		Entry("retry-after-ms without Retry-After", h("Retry-After-Ms", "1500"), 1500*time.Millisecond, 1500*time.Millisecond, health.SourceRetryAfterMs),
		Entry("the earliest OpenAI reset", h("X-Ratelimit-Reset-Requests", "6m0s", "X-Ratelimit-Reset-Tokens", "17s"), 17*time.Second, 17*time.Second, health.SourceOpenAIReset),
		Entry("an Anthropic reset timestamp", h("Anthropic-Ratelimit-Tokens-Reset", t0.Add(30*time.Second).Format(time.RFC3339)), 30*time.Second, 30*time.Second, health.SourceAnthropic),
		Entry("an Anthropic reset already passed is skipped", h("Anthropic-Ratelimit-Requests-Reset", t0.Add(-time.Minute).Format(time.RFC3339), "Anthropic-Ratelimit-Tokens-Reset", t0.Add(20*time.Second).Format(time.RFC3339)), 20*time.Second, 20*time.Second, health.SourceAnthropic),
		Entry("no timing: five seconds", h(), time.Duration(0), 5*time.Second, health.SourceDefault),
		Entry("an unreadable Retry-After falls through to the default", h("Retry-After", "soon"), time.Duration(0), 5*time.Second, health.SourceDefault),
		Entry("an hour asked is capped at five minutes", h("Retry-After", "3600"), time.Hour, 5*time.Minute, health.SourceRetryAfter),
	)

	It("keeps a credential out until the later of two cooldowns, and sums the time cooled", func() {
		c := health.NewRegistry().Cooldown("OPENAI_KEY")
		c.Start(t0, 10*time.Second)
		c.Start(t0.Add(time.Second), 2*time.Second)
		Expect(c.Until()).To(Equal(t0.Add(10 * time.Second)))
		Expect(c.Out(t0.Add(9 * time.Second))).To(BeTrue())
		Expect(c.Out(t0.Add(10 * time.Second))).To(BeFalse())
		c.Start(t0.Add(5*time.Second), 10*time.Second)
		Expect(c.Seconds()).To(Equal(15.0))
	})
})
