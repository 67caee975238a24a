// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package budget

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// Reservation is what admission asks a store to take, all or nothing. Every charge
// takes its own Amount.
type Reservation struct {
	// Requests are the buckets that count requests; each takes 1.
	Requests []Charge
	// Tokens are the buckets of every other amount (tokens, input or output tokens,
	// US dollars); each takes its charge's Amount.
	Tokens []Charge
}

// Result is a store's answer to a Reservation.
type Result struct {
	// Admitted: every bucket was charged.
	Admitted bool
	// RefusedBy is the kind of bucket that refused: Requests (nothing was taken) or a
	// token kind (the request buckets were taken, no token bucket was).
	RefusedBy Kind
	// Refused is the index, in Requests or Tokens, of the first bucket that could not
	// cover the request.
	Refused int
	// RetryAfter is the longest wait any refusing bucket needs to cover the request.
	RetryAfter time.Duration
	// RequestLevels and TokenLevels are each bucket's level after the operation,
	// parallel to the reservation's charges.
	RequestLevels []float64
	TokenLevels   []float64
	// RequestSkipped and TokenSkipped mark buckets that could not be created because
	// their dimension's map was full; they were admitted without charge (fail open).
	RequestSkipped []bool
	TokenSkipped   []bool
	// RequestWarned and TokenWarned mark warn buckets the request did not fit: they
	// took nothing, and did not refuse. Nil when none did.
	RequestWarned []bool
	TokenWarned   []bool
	// Backend is the store that holds the reservation; settlement goes back to it.
	Backend Store
	// Shared is true when a shared store decided on the fleet totals (the charges'
	// Shared parameters); false when a replica's memory decided on its share.
	Shared bool
}

// Store keeps bucket state. Implementations: Memory, and the Redis store. No store
// keeps the charges it is given once an operation returns: the limiter lends them
// from pools.
type Store interface {
	// Reserve takes a Reservation all or nothing: request buckets first (a refusal
	// takes nothing), then the other buckets (a refusal takes only the request
	// buckets). A warn bucket that cannot cover its amount takes nothing and refuses
	// nothing. An error means the store could not decide; nothing was taken. A
	// durable bucket the store cannot hold (a full map, an unreachable backend) is
	// an UnavailableError, never a fail-open.
	Reserve(ctx context.Context, r *Reservation) (Result, error)
	// Refund returns each charge's Amount to its bucket, never above its capacity.
	Refund(ctx context.Context, charges []Charge)
	// Charge takes an overage, each charge's Amount, from its bucket. A bucket that
	// holds it gives it; one that does not gives what overage says: with Debt it goes
	// below zero, at most to minus its capacity, and with Forgive it gives nothing. A
	// calendar counter records the whole overage, whatever overage says. It reports
	// what each bucket gave, in the charges' units (0 for a bucket that gave nothing),
	// the part of it that went below zero (the debt the bucket took on), and each
	// bucket's level after the charge (NaN for a bucket it did not find; levels is
	// nil when the store could not charge at all).
	Charge(ctx context.Context, charges []Charge, overage Overage) (taken, debt, levels []float64)
	// Prune drops the buckets that keep reports false (a dimension or key gone).
	Prune(keep func(Key) bool)
	// Close releases the store's resources.
	Close() error
}

// RefundSender is a store whose refunds travel to its backend with later calls, so
// that a caller need not wait for them. SendRefund returns each charge's Amount to
// its bucket, as Refund does, without waiting for it to be applied: it adds to wg
// what stays pending and marks it done once the refund is applied or given up, so
// that a stopping proxy can wait for it. It keeps nothing of charges once it returns.
type RefundSender interface {
	SendRefund(charges []Charge, wg *sync.WaitGroup)
}

// UnavailableError is returned by a store that cannot reach its backend and may not
// fall back (fail-closed): the request is answered 503 with Retry-After: 5.
type UnavailableError struct {
	Err error
	// RetryAfter, when set, replaces the 5 s the client is told to wait, and
	// Message, when set, what it is told.
	RetryAfter time.Duration
	Message    string
}

func (e *UnavailableError) Error() string { return "budget store unavailable: " + e.Err.Error() }
func (e *UnavailableError) Unwrap() error { return e.Err }

// WithAmount returns a copy of charges, each with the same amount: an operation that
// takes, returns or charges one amount on every bucket.
func WithAmount(charges []Charge, amount float64) []Charge {
	out := make([]Charge, len(charges))
	for i, c := range charges {
		c.Amount = amount
		out[i] = c
	}
	return out
}

// RecoveringError is returned by a store whose durable counters cannot be trusted: the
// state they were kept in was lost (a Redis restart without persistence, or a flush),
// so a calendar or cost budget would otherwise start whole again. Every request
// governed by a durable rule is refused (503 budget_recovering) until the balances are
// restored or attested; rolling token and request rules are unaffected.
type RecoveringError struct {
	// Group is the slot group whose epoch was not found (the Redis key prefix).
	Group string
	// Expected is the epoch this replica runs under; Found is what the store holds
	// instead ("" when it holds none).
	Expected, Found string
	// StoreCheck, when set, is why the counters are fenced instead of a lost epoch: a
	// store check that failed ("maxmemory_policy: allkeys-lru on ..."), or evictions
	// seen. Such a fence is never lifted by replaying a record of the spend: the store
	// itself is at fault.
	StoreCheck string
}

// ClientMessage is what a refused client is told; fromLedger says the fleet attests
// a lost balance from its spend ledger on its own.
func (e *RecoveringError) ClientMessage(fromLedger bool) string {
	switch {
	case e.StoreCheck != "":
		return "a calendar or cost budget that governs this request is fenced: its counter store failed a safety check; " +
			"it refuses until an administrator fixes the store"
	case fromLedger:
		return "a calendar or cost budget that governs this request is recovering from lost counter state; " +
			"it refuses until the fleet attests its balance from its spend ledger, once every replica's spool is flushed"
	}
	return "a calendar or cost budget that governs this request is recovering from lost counter state; " +
		"it refuses until an administrator restores or attests its balance"
}

func (e *RecoveringError) Error() string {
	if e.StoreCheck != "" {
		return fmt.Sprintf("the durable counters of %q are fenced by a store check: %s", e.Group, e.StoreCheck)
	}
	found := "none"
	if e.Found != "" {
		found = e.Found
	}
	return fmt.Sprintf("the durable counters of %q are not trusted: this replica runs under epoch %s, the store holds %s; "+
		"restore or attest the balances (POST /admin/durable/attest)", e.Group, e.Expected, found)
}

// Durable is a store whose durable counters run under the trust fence (the Redis
// store): the epoch each slot group runs under, and the attestation that ends a fence.
type Durable interface {
	// Epochs are the replica's epoch of durable counters by slot group, and whether a
	// group is fenced.
	Epochs() []GroupEpoch
	// Attest writes the balances restore holds (none: adopts what the store holds) and
	// a new epoch, which it returns.
	Attest(ctx context.Context, restore []Charge) (string, error)
}

// GroupEpoch is one slot group's epoch as this replica runs under it: what the
// replica reports to the control plane.
type GroupEpoch struct {
	// Group is the slot group (the key prefix).
	Group string `json:"group"`
	// Epoch is the epoch the replica runs under; empty before it has one.
	Epoch string `json:"epoch,omitempty"`
	// Fenced is true when the last durable admission found another epoch, or none:
	// the group's durable rules answer 503 budget_recovering.
	Fenced bool `json:"fenced,omitempty"`
	// Found is the epoch the store held then ("" when none).
	Found string `json:"found,omitempty"`
	// FencedAt is when this replica's fence began (Unix milliseconds, its own
	// clock): no settlement after it is on a counter the fence could trust.
	FencedAt int64 `json:"fenced_at,omitempty"`
	// SlotGroups, on a Redis Cluster, are the slot groups fenced (each subject's
	// counters live in one of SlotGroups groups); the others still admit.
	SlotGroups []int `json:"slot_groups,omitempty"`
	// StoreFence, when set, fences the durable rules for the store checks' reason
	// (the Redis store's): a check failed in enforce mode, or keys were evicted. It is not
	// a lost epoch (Fenced): fix the store; an eviction also needs an attestation.
	StoreFence string `json:"store_fence,omitempty"`
	// StoreChecks are the store checks' last results.
	StoreChecks []CheckResult `json:"store_checks,omitempty"`
}

// CheckResult is one check's last result.
type CheckResult struct {
	Check  string `json:"check"`
	Result string `json:"result"`
	// Detail says what failed, or why the check was skipped.
	Detail string `json:"detail,omitempty"`
}

// FenceRecorder is a Recorder that also counts the requests a fenced durable rule
// refused (RecoveringError), by the dimension of its first durable bucket.
type FenceRecorder interface {
	DurableFenced(d Dimension)
}
