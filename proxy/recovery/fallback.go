// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package recovery

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/proxy/budget/redisstore"
	"github.com/tokenwarden/tokenwarden/proxy/ledger"
)

// Defaults of a Fallback.
const (
	// FallbackSumTimeout bounds each sum a request waits for.
	FallbackSumTimeout = time.Second
	// DefaultFallbackMaxConcurrent is how many sums may be read at once.
	DefaultFallbackMaxConcurrent = 4
)

// Errors a request the fallback cannot decide fails closed with.
var (
	ErrNoPermit = errors.New("the ledger fallback's concurrent reads are all taken")
)

// Fallback answers the cost budgets counted by API key, user, team or tenant from
// the spend ledger while Redis is unreachable (redisstore.DurableFallback).
//
// A counter's first request of an outage reads, once, what the ledger holds of
// the counter's window (L) and what this replica settled that the ledger may not
// have yet (P: its rows in memory and its spool). From then on the replica admits
// while P plus what it admitted since (S, reservations net of their settlements)
// plus the request fit its share of what the ledger says remains:
//
//	P + S + amount <= (budget - L) / replicas
//
// Each replica holds to its own share of the same remainder, so the fleet admits
// no more than it, but for what the reads miss: the reservations open at them,
// spend flushed between one replica's read and another's (at most 1 - 1/replicas
// of what the fleet held unflushed), and batches dropped from a full spool
// (docs/ledger.md, "The overspend bound"). Budgets it cannot answer (by client,
// global, by model, tokens or requests) stay fail-closed.
type Fallback struct {
	// Report sums the ledger's database; Pending this replica's settlements it may
	// not hold yet (ledger.Ledger.Pending).
	Report, Pending Report
	// Fleet is the fleet's name in the ledger.
	Fleet string
	// Replicas divides the remainder (budget_division.replicas); SetReplicas
	// changes it.
	Replicas int
	// MaxConcurrent bounds the sums read at once; a request that finds none free
	// fails closed (503). Default DefaultFallbackMaxConcurrent.
	MaxConcurrent int
	// Timeout bounds each sum. Default FallbackSumTimeout.
	Timeout time.Duration
	// Clock tells the windows' present. Default the system's.
	Clock budget.Clock
	Log   *slog.Logger

	once     sync.Once
	replicas atomic.Int64
	permits  chan struct{}
	decided  *prometheus.CounterVec
	mu       sync.Mutex
	gen      uint64
	counters map[budget.Key]*fallbackCounter
}

// fallbackCounter is one counter's sums in the current outage.
type fallbackCounter struct {
	ready chan struct{}
	err   error
	// ledger and pending are L and P at the read; spent is S.
	ledger, pending, spent float64
	// replicas divides the remainder: the most the fleet has been since the counter
	// was first asked for (SetReplicas).
	replicas int64
	charge   budget.Charge
	rule     budget.DurableRule
}

var _ redisstore.DurableFallback = (*Fallback)(nil)

func (f *Fallback) init() {
	f.once.Do(func() {
		if f.MaxConcurrent <= 0 {
			f.MaxConcurrent = DefaultFallbackMaxConcurrent
		}
		if f.Timeout <= 0 {
			f.Timeout = FallbackSumTimeout
		}
		f.replicas.Store(int64(max(f.Replicas, 1)))
		if f.Clock == nil {
			f.Clock = budget.SystemClock{}
		}
		if f.Log == nil {
			f.Log = slog.Default()
		}
		f.permits = make(chan struct{}, f.MaxConcurrent)
		f.counters = map[budget.Key]*fallbackCounter{}
		f.decided = prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tokenwarden_ledger_fallback_decisions_total",
			Help: "Requests a cost budget decided from the spend ledger while Redis was unreachable, by result (admitted, refused, no_permit, sum_failed).",
		}, []string{"result"})
	})
}

// Register registers tokenwarden_ledger_fallback_decisions_total{result}.
func (f *Fallback) Register(reg prometheus.Registerer) {
	f.init()
	reg.MustRegister(f.decided)
}

// fallbackDims are the dimensions a fallback answers: the ledger records them, and
// each is one subject's spend.
var fallbackDims = map[budget.Dimension]bool{budget.APIKey: true, budget.User: true, budget.Team: true, budget.Tenant: true}

// Answers implements redisstore.DurableFallback: a cost counter by API key, user,
// team or tenant that the ledger answers (fanned out by nothing or by what it records).
func (f *Fallback) Answers(ch *budget.Charge) bool {
	r, ok := ch.Counter(time.Time{})
	return ok && r.Amount == budget.AmountCost && fallbackDims[r.Dim] && answerable(r)
}

// Reserve implements redisstore.DurableFallback.
func (f *Fallback) Reserve(ctx context.Context, charges []budget.Charge) (redisstore.FallbackDecision, error) {
	f.init()
	counters := make([]*fallbackCounter, len(charges))
	for i := range charges {
		c, err := f.counter(ctx, &charges[i])
		if err != nil {
			result := "sum_failed"
			if errors.Is(err, ErrNoPermit) {
				result = "no_permit"
			}
			f.decided.WithLabelValues(result).Inc()
			return redisstore.FallbackDecision{}, err
		}
		counters[i] = c
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	d := redisstore.FallbackDecision{Admitted: true, Levels: make([]float64, len(charges)), Gen: f.gen}
	for i := range charges {
		ch, c := &charges[i], counters[i]
		level := f.share(ch, c) - c.pending - c.spent
		d.Levels[i] = level
		if ch.Amount <= level {
			continue
		}
		if ch.Warn {
			if d.Warned == nil {
				d.Warned = make([]bool, len(charges))
			}
			d.Warned[i] = true
			continue
		}
		d.Admitted, d.Refused, d.RetryAfter = false, i, f.retryAfter(c)
		f.decided.WithLabelValues("refused").Inc()
		return d, nil
	}
	for i := range charges {
		if d.Warned == nil || !d.Warned[i] {
			counters[i].spent += charges[i].Amount
			d.Levels[i] -= charges[i].Amount
		}
	}
	f.decided.WithLabelValues("admitted").Inc()
	return d, nil
}

// share is the replica's share of what the ledger says remains of ch's budget.
func (f *Fallback) share(ch *budget.Charge, c *fallbackCounter) float64 {
	return (ch.SharedCapacity - c.ledger) / float64(c.replicas)
}

// SetReplicas changes the replicas the remainder is divided by (a reload of
// budget_division.replicas, as the fleet scales). A counter already read this outage
// divides by the most the fleet has been since: its share shrinks as the fleet grows
// and never grows as it shrinks, for what a replica that left spent since the read
// is in no sum this replica holds.
func (f *Fallback) SetReplicas(n int64) {
	f.init()
	n = max(n, 1)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.replicas.Store(n)
	for _, c := range f.counters {
		c.replicas = max(c.replicas, n)
	}
}

// retryAfter is how long a refused counter waits: its calendar window's end, or a
// rolling window's period.
func (f *Fallback) retryAfter(c *fallbackCounter) time.Duration {
	if c.charge.Key.Kind == budget.Calendar {
		return max(time.Second, c.rule.End.Sub(f.Clock.Now()))
	}
	return max(time.Second, c.rule.End.Sub(c.rule.Start))
}

// counter is ch's counter of the current outage, its sums read at its first
// request: by that request, under a permit and the timeout; the requests that come
// while it reads wait for it. A read that failed is forgotten, for the next request
// to try again.
func (f *Fallback) counter(ctx context.Context, ch *budget.Charge) (*fallbackCounter, error) {
	f.mu.Lock()
	c, ok := f.counters[ch.Key]
	if !ok {
		c = &fallbackCounter{ready: make(chan struct{}), charge: *ch, replicas: f.replicas.Load()}
		c.charge.Amount = 0
		f.counters[ch.Key] = c
	}
	gen := f.gen
	f.mu.Unlock()
	if ok {
		select {
		case <-c.ready:
			return c, c.err
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	c.err = f.read(ctx, c)
	if c.err != nil {
		f.mu.Lock()
		if f.gen == gen && f.counters[ch.Key] == c {
			delete(f.counters, ch.Key)
		}
		f.mu.Unlock()
	}
	close(c.ready)
	return c, c.err
}

// read sums c's window: this replica's pending settlements first, then the
// ledger's, so that a batch flushed between the two counts at least once.
func (f *Fallback) read(ctx context.Context, c *fallbackCounter) error {
	select {
	case f.permits <- struct{}{}:
	default:
		return ErrNoPermit
	}
	defer func() { <-f.permits }()
	// The request's own deadline may be shorter; the others waiting need the sum.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), f.Timeout)
	defer cancel()
	r, _ := c.charge.Counter(f.Clock.Now())
	c.rule = r
	start := time.Now()
	pending, err := f.sum(rctx, f.Pending, r, &c.charge)
	if err != nil {
		return fmt.Errorf("the replica's pending spend: %w", err)
	}
	spent, err := f.sum(rctx, f.Report, r, &c.charge)
	if err != nil {
		return fmt.Errorf("the spend ledger did not sum rule %q for %s %q within %s: %w", r.Rule, r.Dim, c.charge.Key.ID, f.Timeout, err)
	}
	c.pending, c.ledger = pending, spent
	f.Log.Info("Redis is unreachable: a cost budget answers from the spend ledger", "rule", r.Rule, "window", r.Window,
		"dimension", r.Dim.String(), "id", c.charge.Key.ID, "ledger", spent, "pending", pending, "took", time.Since(start))
	return nil
}

// sum is what report holds of ch's counter: its subject's (and count_by value's)
// spend in the window, in dollars.
func (f *Fallback) sum(ctx context.Context, report Report, r budget.DurableRule, ch *budget.Charge) (float64, error) {
	if report == nil {
		return 0, nil
	}
	where := map[ledger.Dimension]string{ledgerDims[r.Dim]: ch.Key.ID}
	if d, ok := ledgerDims[r.CountBy]; ok {
		where[d] = ch.Key.By
	}
	narrowed := func(ctx context.Context, q ledger.Query) ([]ledger.ReportRow, error) {
		for d, v := range where {
			q.Where[d] = v
		}
		return report(ctx, q)
	}
	bs, err := ruleBalances(ctx, narrowed, f.Fleet, r, 1)
	if err != nil {
		return 0, err
	}
	total := 0.0
	for _, b := range bs {
		if b.Subject == ch.Key.ID && b.By == ch.Key.By {
			total += b.Spent
		}
	}
	return total, nil
}

// Refund implements redisstore.DurableFallback.
func (f *Fallback) Refund(gen uint64, charges []budget.Charge) bool {
	return f.settle(gen, charges, -1)
}

// Charge implements redisstore.DurableFallback.
func (f *Fallback) Charge(gen uint64, charges []budget.Charge) bool {
	return f.settle(gen, charges, 1)
}

func (f *Fallback) settle(gen uint64, charges []budget.Charge, sign float64) bool {
	f.init()
	f.mu.Lock()
	defer f.mu.Unlock()
	if gen != f.gen {
		return false
	}
	for i := range charges {
		if c, ok := f.counters[charges[i].Key]; ok {
			c.spent = math.Max(0, c.spent+sign*charges[i].Amount)
		}
	}
	return true
}

// Drain implements redisstore.DurableFallback: the outage is over; its spend, one
// charge per counter, and a fresh read at the next.
func (f *Fallback) Drain() []budget.Charge {
	f.init()
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []budget.Charge
	for _, c := range f.counters {
		if c.spent > 0 {
			ch := c.charge
			ch.Amount = c.spent
			out = append(out, ch)
		}
	}
	f.gen++
	f.counters = map[budget.Key]*fallbackCounter{}
	return out
}
