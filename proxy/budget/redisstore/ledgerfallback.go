// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package redisstore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
)

// DurableFallback decides, while Redis is unreachable, the durable charges it can
// answer from another record of the spend (recovery.Fallback: the spend ledger),
// instead of failing them closed. Each decision runs under a generation: the
// outage it belongs to. Drain ends the generation.
type DurableFallback interface {
	// Answers tells whether it can decide ch.
	Answers(ch *budget.Charge) bool
	// Reserve decides charges, all or nothing (a warn charge never refuses). An
	// error means it could not decide: the request fails closed.
	Reserve(ctx context.Context, charges []budget.Charge) (FallbackDecision, error)
	// Refund and Charge settle what generation gen admitted; false once gen has
	// ended (its spend was drained), when they belong to Redis again.
	Refund(gen uint64, charges []budget.Charge) bool
	Charge(gen uint64, charges []budget.Charge) bool
	// Drain ends the generation and returns what it admitted, one charge per
	// counter with the amount spent.
	Drain() []budget.Charge
}

// FallbackDecision is a DurableFallback's answer, parallel to the charges.
type FallbackDecision struct {
	Admitted bool
	// Refused is the index of the first charge that did not fit; RetryAfter how long
	// it needs.
	Refused    int
	RetryAfter time.Duration
	// Levels are what each counter's share holds after the decision; Warned marks
	// the warn charges that did not fit (nil when none).
	Levels []float64
	Warned []bool
	// Gen is the generation the decision was made under.
	Gen uint64
}

// FallbackUnavailableRetry is the Retry-After of a request the durable fallback
// could not decide in time.
const FallbackUnavailableRetry = time.Second

// SetDurableFallback puts a durable fallback in force (nil: none, every durable
// charge fails closed while Redis is unreachable).
func (s *Store) SetDurableFallback(f DurableFallback) {
	if f == nil {
		s.durableFallback.Store(nil)
		return
	}
	s.durableFallback.Store(&f)
}

// answersAll reports whether f decides every durable charge of r; a durable
// request-count charge is never one.
func answersAll(f DurableFallback, r *budget.Reservation) bool {
	for i := range r.Requests {
		if r.Requests[i].Durable {
			return false
		}
	}
	for i := range r.Tokens {
		if r.Tokens[i].Durable && !f.Answers(&r.Tokens[i]) {
			return false
		}
	}
	return true
}

// reserveDurableFallback decides r while Redis is unreachable: its rolling buckets
// on the replica's memory (mem; none fails them closed), then its durable charges
// on f. A refusal of f returns what the memory took of the token buckets; an error
// of f, all of it.
func (s *Store) reserveDurableFallback(ctx context.Context, r *budget.Reservation, f DurableFallback, mem *budget.Memory) (budget.Result, error) {
	var rest budget.Reservation
	rest.Requests = r.Requests
	durable, restTokens, durIx, restIx := split(r.Tokens)
	rest.Tokens = restTokens
	res := budget.Result{
		Admitted:       true,
		RequestLevels:  make([]float64, len(r.Requests)),
		TokenLevels:    make([]float64, len(r.Tokens)),
		RequestSkipped: make([]bool, len(r.Requests)),
		TokenSkipped:   make([]bool, len(r.Tokens)),
	}
	var memRes budget.Result
	if len(rest.Requests)+len(rest.Tokens) > 0 {
		if mem == nil {
			return budget.Result{}, &budget.UnavailableError{Err: errors.New("redis is unreachable and fallback_to_memory is off")}
		}
		var err error
		if memRes, err = mem.Reserve(ctx, &rest); err != nil {
			return budget.Result{}, err
		}
		copy(res.RequestLevels, memRes.RequestLevels)
		copy(res.RequestSkipped, memRes.RequestSkipped)
		res.RequestWarned = memRes.RequestWarned
		for j, i := range restIx {
			res.TokenLevels[i], res.TokenSkipped[i] = memRes.TokenLevels[j], memRes.TokenSkipped[j]
			if memRes.TokenWarned != nil {
				if res.TokenWarned == nil {
					res.TokenWarned = make([]bool, len(r.Tokens))
				}
				res.TokenWarned[i] = memRes.TokenWarned[j]
			}
		}
		if !memRes.Admitted {
			res.Admitted, res.RefusedBy, res.Refused, res.RetryAfter = false, memRes.RefusedBy, memRes.Refused, memRes.RetryAfter
			if memRes.RefusedBy != budget.Requests {
				res.Refused = restIx[memRes.Refused]
			}
			return res, nil
		}
	}
	d, err := f.Reserve(ctx, durable)
	if err != nil {
		if mem != nil {
			mem.Refund(ctx, budget.WithAmount(rest.Requests, 1))
			mem.Refund(ctx, takenOf(rest.Tokens, memRes))
		}
		return budget.Result{}, &budget.UnavailableError{Err: fmt.Errorf("redis is unreachable, and its durable fallback: %w", err), RetryAfter: FallbackUnavailableRetry,
			Message: "the budget store is unreachable, and the spend ledger could not answer for this request's cost budget in time; retry later"}
	}
	for j, i := range durIx {
		res.TokenLevels[i] = d.Levels[j]
		if d.Warned != nil && d.Warned[j] {
			if res.TokenWarned == nil {
				res.TokenWarned = make([]bool, len(r.Tokens))
			}
			res.TokenWarned[i] = true
		}
	}
	if !d.Admitted {
		if mem != nil {
			mem.Refund(ctx, takenOf(rest.Tokens, memRes))
		}
		res.Admitted, res.Refused, res.RetryAfter = false, durIx[d.Refused], d.RetryAfter
		res.RefusedBy = r.Tokens[res.Refused].Key.Kind
		return res, nil
	}
	s.fallbackOwed.Store(true)
	res.Backend = &fallbackHold{s: s, mem: mem, f: f, gen: d.Gen}
	return res, nil
}

// takenOf are the token charges the memory took: not the warn buckets that did not
// fit, nor the ones it skipped.
func takenOf(charges []budget.Charge, res budget.Result) []budget.Charge {
	var out []budget.Charge
	for i := range charges {
		if (res.TokenWarned != nil && res.TokenWarned[i]) || (res.TokenSkipped != nil && res.TokenSkipped[i]) {
			continue
		}
		out = append(out, charges[i])
	}
	return out
}

// replayFallback charges Redis, once it answers again, with what the durable
// fallback admitted while it did not, so that the counters hold the outage's spend.
// It does not when Redis holds another epoch than the replica runs under: its
// counters were lost, and are attested from the ledger, which holds that spend.
func (s *Store) replayFallback() {
	if !s.fallbackOwed.CompareAndSwap(true, false) {
		return
	}
	fp := s.durableFallback.Load()
	if fp == nil {
		return
	}
	s.workers.Add(1)
	go func() {
		defer s.workers.Done()
		if charges := (*fp).Drain(); len(charges) > 0 {
			s.replay(charges, "replayed:"+randomPart())
		}
	}()
}

// Retry timings of what is sent again until it lands (a replay, a board record):
// the first retry's wait, doubled up to the last. replayMarkTTL is how long a
// replay's mark outlives it.
const (
	retryFirst    = time.Second
	retryMax      = 30 * time.Second
	replayMarkTTL = 24 * time.Hour
)

// pause waits *wait before a retry, then doubles it up to retryMax; false, at once,
// when the store closes.
func (s *Store) pause(wait *time.Duration) bool {
	select {
	case <-s.done:
		return false
	case <-time.After(*wait):
	}
	*wait = min(2**wait, retryMax)
	return true
}

// replay charges Redis with charges, once: each slot group's part in one call with
// the group's mark name, retried until every part landed, the store closes, or Redis
// holds another epoch. A call whose answer was lost may have charged: sent again,
// it finds its mark and charges nothing.
func (s *Store) replay(charges []budget.Charge, mark string) {
	parts := [][]int{nil}
	if s.sharded {
		parts = splitCharges(charges)
	}
	wait := retryFirst
	for attempt := 1; ; attempt++ {
		var err error
		parts, err = s.replayOnce(charges, parts, mark)
		switch {
		case errors.Is(err, errOtherEpoch):
			s.log.Warn("Redis answers again without the epoch the fallback's spend was counted under; the spend is not charged to it (the ledger holds it)",
				"counters", len(charges))
			return
		case err == nil:
			s.log.Info("Redis answers again: the spend admitted on the durable fallback is charged to its counters", "counters", len(charges), "attempts", attempt)
			return
		}
		if attempt == 1 {
			s.log.Warn("Redis answers again, but the spend admitted on the durable fallback could not be charged to it yet; retrying until it is",
				"counters", len(charges), "error", err)
		}
		if !s.pause(&wait) {
			s.log.Warn("The store closed before the spend admitted on the durable fallback was charged to Redis (the ledger holds it)", "counters", len(charges))
			return
		}
	}
}

// errOtherEpoch is a Redis that holds another epoch than the replica runs under.
var errOtherEpoch = errors.New("redis holds another epoch")

// replayOnce sends the parts of charges (indexes into it; nil: all of it) that have
// not landed, and returns those that still have not.
func (s *Store) replayOnce(charges []budget.Charge, parts [][]int, mark string) ([][]int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	held, err := s.StoredEpoch(ctx)
	if err != nil {
		return parts, err
	}
	if held == "" || held != s.want() {
		return nil, errOtherEpoch
	}
	var left [][]int
	var firstErr error
	for _, ix := range parts {
		part := charges
		if ix != nil {
			part = make([]budget.Charge, len(ix))
			for j, i := range ix {
				part[j] = charges[i]
			}
		}
		if err := s.replayPart(ctx, part, mark); err != nil {
			left = append(left, ix)
			firstErr = cmp.Or(firstErr, err)
		}
	}
	return left, firstErr
}

// replayPart charges one slot group's part, behind the group's mark.
func (s *Store) replayPart(ctx context.Context, part []budget.Charge, mark string) error {
	g := s.groups[0]
	if s.sharded {
		g = s.groups[groupOf(part[0].Key)]
	}
	p := newSpec(len(part))
	for _, ch := range part {
		p.add(s, ch.Key, ch.SharedCapacity, ch.SharedRate, ch.Amount)
	}
	p.keys = append(p.keys, g.prefix+mark)
	if s.beforeReplay != nil {
		s.beforeReplay()
	}
	err := s.runScript(ctx, replayScript, p.keys, p.buf, budget.Debt.String(), replayMarkTTL.Milliseconds()).Err()
	if err != nil {
		return fmt.Errorf("charge the fallback's spend: %w", err)
	}
	return nil
}

// fallbackHold is the backend of a reservation decided while Redis was
// unreachable: its rolling buckets settle on the replica's memory, its durable
// charges on the fallback while its generation lasts, and on Redis after.
type fallbackHold struct {
	s   *Store
	mem *budget.Memory
	f   DurableFallback
	gen uint64
}

// split separates the durable charges from the others.
func split(charges []budget.Charge) (durable, rest []budget.Charge, durIx, restIx []int) {
	for i := range charges {
		if charges[i].Durable {
			durable, durIx = append(durable, charges[i]), append(durIx, i)
		} else {
			rest, restIx = append(rest, charges[i]), append(restIx, i)
		}
	}
	return durable, rest, durIx, restIx
}

// Reserve implements budget.Store; a hold never reserves.
func (h *fallbackHold) Reserve(context.Context, *budget.Reservation) (budget.Result, error) {
	return budget.Result{}, errors.New("a fallback hold takes no reservation")
}

// Refund implements budget.Store.
func (h *fallbackHold) Refund(ctx context.Context, charges []budget.Charge) {
	durable, rest, _, _ := split(charges)
	if len(rest) > 0 && h.mem != nil {
		h.mem.Refund(ctx, rest)
	}
	if len(durable) > 0 && !h.f.Refund(h.gen, durable) {
		h.s.Refund(ctx, durable)
	}
}

// Charge implements budget.Store: a durable overage is the fallback's whole (it
// counts spend, and has no floor to stop at).
func (h *fallbackHold) Charge(ctx context.Context, charges []budget.Charge, overage budget.Overage) (taken, debt, levels []float64) {
	n := len(charges)
	taken, debt, levels = make([]float64, n), make([]float64, n), make([]float64, n)
	durable, rest, durIx, restIx := split(charges)
	if len(rest) > 0 && h.mem != nil {
		t, d, l := h.mem.Charge(ctx, rest, overage)
		for j, i := range restIx {
			taken[i], debt[i], levels[i] = t[j], d[j], math.NaN()
			if l != nil {
				levels[i] = l[j]
			}
		}
	}
	if len(durable) > 0 {
		if h.f.Charge(h.gen, durable) {
			for j, i := range durIx {
				taken[i], levels[i] = durable[j].Amount, math.NaN()
			}
		} else {
			t, d, l := h.s.Charge(ctx, durable, overage)
			for j, i := range durIx {
				taken[i], debt[i], levels[i] = t[j], d[j], math.NaN()
				if l != nil {
					levels[i] = l[j]
				}
			}
		}
	}
	return taken, debt, levels
}

// Prune implements budget.Store.
func (h *fallbackHold) Prune(func(budget.Key) bool) {}

// Close implements budget.Store.
func (h *fallbackHold) Close() error { return nil }
