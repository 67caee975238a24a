// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

// Package budget holds the token and request buckets: the dimensions and periods, the
// resolved allowances (unlimited versus zero), the Store interface with its in-memory
// implementation, and the Limiter that turns a request's identity and estimate into one
// all-or-nothing reservation and settles it on the usage the backend reports.
package budget

import (
	"math"
	"time"
)

// Dimension is one admission-time dimension a budget attaches to.
type Dimension uint8

// The dimensions, in the order a reservation charges them: the six of the limits, and
// the tenant a key belongs to (rules only).
const (
	Global Dimension = iota
	Client
	APIKey
	User
	Team
	Model
	Tenant
	NumDimensions
)

var dimensionNames = [NumDimensions]string{"global", "client", "api_key", "user", "team", "model", "tenant"}

// String is the fixed dimension name used in metrics, refusals and logs.
func (d Dimension) String() string {
	if d < NumDimensions {
		return dimensionNames[d]
	}
	return "unknown"
}

// Shared reports whether other tenants draw on the dimension's buckets, so that a
// refusal must not reveal their level. Only api_key is identity-scoped.
func (d Dimension) Shared() bool { return d != APIKey }

// Kind is what a bucket counts.
type Kind uint8

// Bucket kinds. Each dimension and kind is its own bucket map with its own max_buckets
// bound. Requests, TokensMinute and TokensDay are the buckets of rate_limiting.limits
// and the per-key overrides; Rolling and Calendar are the counters of
// rate_limiting.rules, whatever their amount.
const (
	Requests Kind = iota
	TokensMinute
	TokensDay
	// Rolling is a rule's rolling window: a token bucket.
	Rolling
	// Calendar is a rule's calendar window: a counter that starts whole at each
	// anchor. Only a shared store holds one.
	Calendar
	// InFlight is a rule's in-flight limit: slots, not a bucket (slots.go).
	InFlight
	NumKinds
)

var kindNames = [NumKinds]string{"requests", "minute", "day", "rolling", "calendar", "in_flight"}

// String names the kind; for token kinds it is the period name ("minute", "day").
func (k Kind) String() string {
	if k < NumKinds {
		return kindNames[k]
	}
	return "unknown"
}

// Period is the length whose rate a token bucket holds: a minute or a day.
func (k Kind) Period() time.Duration {
	switch k {
	case TokensMinute:
		return time.Minute
	case TokensDay:
		return 24 * time.Hour
	default:
		return time.Second
	}
}

// Allowance is a resolved allowance for one period. It tells "unlimited" (a configured
// 0) from "zero" (a positive fleet total divided down to nothing), which refuses every
// positive reservation.
type Allowance struct {
	limited bool
	n       int64
	// fleet is the configured fleet total the allowance was divided from: what a
	// shared (Redis) bucket holds.
	fleet int64
}

// Unlimited is the allowance of a configured 0.
func Unlimited() Allowance { return Allowance{} }

// Divide resolves a configured fleet total: 0 is unlimited; a positive value is divided
// by the replica count with integer floor and may become a zero allowance.
func Divide(configured, replicas int64) Allowance {
	if configured <= 0 {
		return Unlimited()
	}
	if replicas < 1 {
		replicas = 1
	}
	return Allowance{limited: true, n: configured / replicas, fleet: configured}
}

// Limited reports whether the allowance is in force.
func (a Allowance) Limited() bool { return a.limited }

// Tokens is the allowance this replica enforces in its own memory (0 when unlimited or
// zero).
func (a Allowance) Tokens() int64 { return a.n }

// Key identifies one bucket.
type Key struct {
	Kind Kind
	Dim  Dimension
	// Window is the index of a rule's window in its windows; 0 for limits.
	Window uint8
	// ID is the identity within the dimension: the client address, key name, user,
	// team or model; empty for global.
	ID string
	// Tenant is the tenant whose level the bucket is (a tenant's rule); empty for the
	// platform's. A tenant's subjects are its own: a store keeps them apart from the
	// platform's and other tenants' of the same dimension and id.
	Tenant string
	// Rule is the name of the rule a counter belongs to; empty for the buckets of
	// limits and the per-key overrides.
	Rule string
	// By is the count_by value of a rule that fans out (the model of "per key per
	// model"); empty otherwise.
	By string
	// Start is a calendar window's start, in Unix seconds; 0 for a rolling bucket.
	// Each calendar window is its own counter.
	Start int64
}

// Charge is one bucket a reservation draws on, with the parameters in force when the
// reservation was made.
type Charge struct {
	Key Key
	// Capacity is the bucket's size in a replica's memory (the divided share); a bucket
	// starts full.
	Capacity float64
	// Rate is the continuous refill in units per second.
	Rate float64
	// SharedCapacity and SharedRate are the fleet totals a shared store holds: the
	// budget is not divided when every replica draws on the same bucket.
	SharedCapacity float64
	SharedRate     float64
	// Amount is what the operation takes from the bucket (a reservation: 1 on a
	// request-count bucket), returns to it (a refund) or charges it (an overage), in
	// the bucket's units: requests, tokens or US dollars.
	Amount float64
	// Period is what a zero allowance, which never refills, tells a request to wait;
	// 0 is the kind's period.
	Period time.Duration
	// EndMillis is when a calendar window ends, in Unix milliseconds on the store's
	// clock: the counter is whole again then, and expires.
	EndMillis int64
	// Warn: a request that does not fit takes nothing from this bucket and is still
	// admitted (a rule with action: warn).
	Warn bool
	// Durable: the bucket must never fail open (a calendar window or a cost amount):
	// a store that cannot hold it refuses with UnavailableError.
	Durable bool
	// ctr is the compiled budget the charge comes from.
	ctr *counter
	// held is the bucket's level after the reservation, on a hold's copy only (NaN
	// when the store did not know it): a refund's level is told from it.
	held float64
}

// WaitPeriod is the wait a zero allowance reports: Period, or the kind's period.
func (c *Charge) WaitPeriod() time.Duration {
	if c.Period > 0 {
		return c.Period
	}
	return c.Key.Kind.Period()
}

// Shared returns the charge with the shared store's parameters in place of the
// replica-local ones.
func (c Charge) Shared() Charge {
	c.Capacity, c.Rate = c.SharedCapacity, c.SharedRate
	return c
}

// tokenCharge builds the bucket of a token allowance for one period.
func tokenCharge(kind Kind, dim Dimension, id string, a Allowance) Charge {
	secs := kind.Period().Seconds()
	c, f := float64(a.n), float64(a.fleet)
	return Charge{Key: Key{Kind: kind, Dim: dim, ID: id}, Capacity: c, Rate: c / secs, SharedCapacity: f, SharedRate: f / secs}
}

// retryAfter is how long a bucket at level needs until it holds amount: a debt (a
// level below zero) is repaid first. A request larger than the whole bucket is told
// the time to repay the debt and refill its own cost. It saturates rather than wraps.
func retryAfter(level, amount float64, ch Charge) time.Duration {
	if ch.Rate <= 0 {
		// A zero allowance never refills: tell the caller to come back after one period.
		return ch.WaitPeriod()
	}
	need := amount - level
	if amount > ch.Capacity {
		need = amount + max(0, -level)
	}
	if !(need > 0) {
		return 0
	}
	return Seconds(need / ch.Rate)
}

// MaxDuration is the longest time.Duration: a wait too long to express saturates to it.
const MaxDuration = time.Duration(math.MaxInt64)

// Seconds converts seconds to a Duration, saturating at 0 and MaxDuration instead of
// wrapping (an estimate may be as large as math.MaxInt64/4 tokens).
func Seconds(s float64) time.Duration {
	ns := s * float64(time.Second)
	switch {
	case !(ns > 0): // also NaN
		return 0
	case !(ns < float64(math.MaxInt64)):
		return MaxDuration
	}
	return time.Duration(ns)
}

// saturatedInt converts a token count to int64, saturating at 0 and math.MaxInt64.
func saturatedInt(f float64) int64 {
	switch {
	case !(f > 0):
		return 0
	case !(f < float64(math.MaxInt64)):
		return math.MaxInt64
	}
	return int64(f)
}

// Overage is what settlement does with usage beyond the reservation that a bucket
// cannot cover.
type Overage uint8

const (
	// Debt drives the bucket below zero, at most one capacity below: the tenant repays
	// it by waiting for the refill (rate_limiting.overage: debt, the default).
	Debt Overage = iota
	// Forgive consumes nothing from a bucket that cannot cover the overage, rather than
	// drain it partly (rate_limiting.overage: forgive).
	Forgive
)

func (o Overage) String() string {
	if o == Forgive {
		return "forgive"
	}
	return "debt"
}

// Clock gives the time; tests inject a fake one instead of sleeping for a refill.
type Clock interface{ Now() time.Time }

// SystemClock is the wall clock.
type SystemClock struct{}

// Now returns time.Now().
func (SystemClock) Now() time.Time { return time.Now() }
