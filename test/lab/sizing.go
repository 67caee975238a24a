// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package lab

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
)

// Traffic is one tenant's traffic for sizing its token bucket: how large must the
// bucket be for the burst I consider legitimate?
type Traffic struct {
	// Rate is the normal requests per second; BurstMultiplier multiplies it for
	// BurstSeconds.
	Rate, BurstMultiplier, BurstSeconds float64
	// Prompt and Answer are the tokens a request uses; MaxTokens what it reserves.
	Prompt, Answer, MaxTokens float64
	// Duration is how long a request holds its reservation, in seconds.
	Duration float64
	// TokensPerMinute is the contract: the bucket's refill.
	TokensPerMinute float64
}

// Validate names the first field that cannot be sized.
func (t Traffic) Validate() error {
	switch {
	case !(t.Rate > 0):
		return fmt.Errorf("rate must be positive, got %v", t.Rate)
	case t.BurstMultiplier < 1:
		return fmt.Errorf("burst must be at least 1 (times the rate), got %v", t.BurstMultiplier)
	case t.BurstSeconds < 0:
		return fmt.Errorf("burst-seconds must not be negative, got %v", t.BurstSeconds)
	case !(t.Prompt > 0) || !(t.Answer > 0):
		return fmt.Errorf("prompt and answer must be positive, got %v and %v", t.Prompt, t.Answer)
	case t.MaxTokens < t.Answer:
		return fmt.Errorf("max-tokens must be at least the answer (%v), got %v", t.Answer, t.MaxTokens)
	case t.Duration < 0:
		return fmt.Errorf("duration must not be negative, got %v", t.Duration)
	case !(t.TokensPerMinute > 0):
		return fmt.Errorf("tpm must be positive, got %v", t.TokensPerMinute)
	}
	return nil
}

// Sizing is the bucket the sizing rule gives, with the arithmetic behind it.
type Sizing struct {
	PeakRate, Reserve, Refund, NetDraw, Refill, Deficit, InFlight float64
	// Tokens is the bucket size; Seconds the same in seconds of refill.
	Tokens, Seconds float64
}

// Size applies the sizing rule: the excess of peak draw over refill for the burst's
// length, plus the budget in-flight reservations hold (max_tokens less the answer, for
// each request running).
func Size(t Traffic) Sizing {
	var s Sizing
	s.PeakRate = t.Rate * t.BurstMultiplier
	s.Reserve = s.PeakRate * (t.Prompt + t.MaxTokens)
	s.Refund = s.PeakRate * (t.MaxTokens - t.Answer)
	s.NetDraw = s.Reserve - s.Refund
	s.Refill = t.TokensPerMinute / 60
	s.Deficit = math.Max(0, s.NetDraw-s.Refill) * t.BurstSeconds
	s.InFlight = s.PeakRate * t.Duration * (t.MaxTokens - t.Answer)
	s.Tokens = s.Deficit + s.InFlight
	s.Seconds = s.Tokens / s.Refill
	return s
}

// String is the rule's arithmetic, line by line.
func (s Sizing) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "reserve rate   = %.2f req/s × prompt + max_tokens  = %8.0f tokens/s\n", s.PeakRate, s.Reserve)
	fmt.Fprintf(&b, "refund rate    = %.2f req/s × unused max_tokens     = %8.0f tokens/s\n", s.PeakRate, s.Refund)
	fmt.Fprintf(&b, "net draw                                          = %8.0f tokens/s against refill %.0f tokens/s\n", s.NetDraw, s.Refill)
	fmt.Fprintf(&b, "deficit        = excess × burst length              = %8.0f tokens\n", s.Deficit)
	fmt.Fprintf(&b, "+ reservations in flight                          = %8.0f tokens\n", s.InFlight)
	fmt.Fprintf(&b, "bucket needed                                     = %8.0f tokens = %.1f s of refill\n", s.Tokens, s.Seconds)
	return b.String()
}

// SimulateBucket runs the traffic against a token bucket of size tokens with
// reservation at admission and refund on completion (Poisson arrivals, the burst after
// lead seconds of normal traffic with a full bucket), and returns the share of the
// burst's requests refused.
func SimulateBucket(t Traffic, size float64, seed uint64) float64 {
	const lead = 60.0
	rng := rand.New(rand.NewPCG(seed, 1))
	refill := t.TokensPerMinute / 60
	level, last := size, 0.0
	type refund struct{ at, tokens float64 }
	var pending []refund
	take := func(now float64) {
		// Refunds due before now come back in time order.
		for len(pending) > 0 && pending[0].at <= now {
			level = math.Min(size, level+(pending[0].at-last)*refill)
			last = pending[0].at
			level = math.Min(size, level+pending[0].tokens)
			pending = pending[1:]
		}
		level = math.Min(size, level+(now-last)*refill)
		last = now
	}
	peak := t.Rate * t.BurstMultiplier
	end := lead + t.BurstSeconds
	refused, burst := 0, 0
	for now := rng.ExpFloat64() / peak; now < end; now += rng.ExpFloat64() / peak {
		rate := t.Rate
		if now >= lead {
			rate = peak
		}
		if rng.Float64()*peak >= rate {
			continue
		}
		take(now)
		cost := t.Prompt + t.MaxTokens
		inBurst := now >= lead
		if inBurst {
			burst++
		}
		if level < cost {
			if inBurst {
				refused++
			}
			continue
		}
		level -= cost
		pending = append(pending, refund{at: now + t.Duration, tokens: t.MaxTokens - t.Answer})
	}
	if burst == 0 {
		return 0
	}
	return float64(refused) / float64(burst)
}

// SizeApps sizes one chat app's bucket for the world's burst under the apps' contract,
// with a request's duration from the backend's step time at its batch size.
func (w *World) SizeApps() Sizing { return Size(w.AppTraffic()) }

// AppTraffic is one chat app's traffic for sizing.
func (w *World) AppTraffic() Traffic {
	apps := w.Of(KindChat)
	t := apps[0]
	step := (w.Backend.StepBaseMillis + w.Backend.StepPerTokenMillis*float64(w.Backend.MaxBatch)) / 1000
	return Traffic{Rate: t.Rate, BurstMultiplier: w.Burst.Multiplier, BurstSeconds: w.Burst.Seconds,
		Prompt: float64(t.Prompt), Answer: float64(t.Answer), MaxTokens: float64(t.MaxTokens),
		Duration: float64(t.Answer) * step, TokensPerMinute: float64(w.Missions.AppContractPerMinute)}
}
