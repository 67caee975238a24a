// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

// Package recovery attests a fleet's lost durable counters from its spend ledger.
//
// When Redis loses the counters of the calendar and cost budgets (a restart without
// persistence, a flush), the trust fence answers 503 budget_recovering until the
// balances are attested. A fleet with a shared PostgreSQL ledger holds an independent
// record of what every replica settled, so it need not wait for a person: once every
// live replica has flushed its settlements into the ledger past the moment of the
// loss, the control plane says so in the config (rate_limiting.redis.ledger_attestation),
// and one replica, under a claim kept in Redis, sums each durable counter's current
// window from the ledger and attests the balances through the same path an
// administrator's restore takes (a new epoch). The balances are attested from a
// record, not reset: a counter is never set below what the ledger holds.
package recovery

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/proxy/budget/redisstore"
	"github.com/tokenwarden/tokenwarden/proxy/config"
	"github.com/tokenwarden/tokenwarden/proxy/ledger"
)

// Source is the replica an attester attests for (proxy/server.Server).
type Source interface {
	// Durable is the store's trust fence; false when it keeps no durable counters.
	Durable() (budget.Durable, bool)
	// RestoreCharge is the charge that restores a balance under the config in force.
	RestoreCharge(b budget.Balance) (budget.Charge, error)
	// DurableRules are the durable counters of the config in force and what a cached
	// input token counts.
	DurableRules() ([]budget.DurableRule, float64)
}

// Store is what of the counter store an attestation needs beyond the fence
// (redisstore.Store): the one claim of the fleet on it, and the epoch it holds.
type Store interface {
	ClaimAttestation(ctx context.Context, lost string, ttl time.Duration) (bool, error)
	ReleaseAttestation(ctx context.Context) error
	StoredEpoch(ctx context.Context) (string, error)
}

// Report sums the ledger's rollups (ledger.Sink.Report).
type Report func(ctx context.Context, q ledger.Query) ([]ledger.ReportRow, error)

// Outcomes of an attempt, as tokenwarden_durable_ledger_attestations_total counts them.
const (
	// Attested: this replica attested the balances from the ledger.
	Attested = "attested"
	// Elsewhere: another replica holds the claim, or has attested already.
	Elsewhere = "elsewhere"
	// StoreCheck: the fence is a store check's, which no record can lift.
	StoreCheck = "store_check"
	// Unanswerable: a durable rule counts by what the ledger does not record (the
	// client address); the fence stays for an administrator.
	Unanswerable = "unanswerable"
	// LedgerFailed: the ledger could not be read in time; the fence stays and the
	// attempt is made again.
	LedgerFailed = "ledger_failed"
	// StoreFailed: the attestation could not be written to the store.
	StoreFailed = "store_failed"
	// Nothing: no fence this order is for (none, or one of another epoch).
	Nothing = "nothing"
)

// Defaults of an Attester.
const (
	DefaultRetry = 5 * time.Second
	// ClaimTTL bounds a claim: a replica that dies while attesting leaves it to
	// another after this long. An attempt takes far less (each read and write is
	// bounded by SumTimeout and WriteTimeout).
	ClaimTTL     = 2 * time.Minute
	SumTimeout   = 10 * time.Second
	WriteTimeout = 10 * time.Second
)

// Attester attests the replica's lost durable counters from the ledger when the
// config orders it (Order), retrying while the order stands and the fence is up.
type Attester struct {
	Source Source
	Store  Store
	Report Report
	// Fleet is the fleet's name in the ledger (config ledger.fleet).
	Fleet string
	Log   *slog.Logger
	// Retry is how long a failed attempt waits for the next. Default DefaultRetry.
	Retry time.Duration

	attempts *prometheus.CounterVec
	mu       sync.Mutex
	order    *config.LedgerAttestation
	kick     chan struct{}
	once     sync.Once
}

// Register registers the attester's counter,
// tokenwarden_durable_ledger_attestations_total{result}.
func (a *Attester) Register(reg prometheus.Registerer) {
	a.init()
	reg.MustRegister(a.attempts)
}

func (a *Attester) init() {
	a.once.Do(func() {
		a.kick = make(chan struct{}, 1)
		if a.Log == nil {
			a.Log = slog.Default()
		}
		if a.Retry <= 0 {
			a.Retry = DefaultRetry
		}
		a.attempts = prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tokenwarden_durable_ledger_attestations_total",
			Help: "Attempts to attest lost durable counters from the spend ledger, by result (attested, elsewhere, store_check, unanswerable, ledger_failed, store_failed).",
		}, []string{"result"})
	})
}

// Order records the config's ledger attestation (nil: none) and wakes Run.
func (a *Attester) Order(o *config.LedgerAttestation) {
	a.init()
	a.mu.Lock()
	a.order = o
	a.mu.Unlock()
	select {
	case a.kick <- struct{}{}:
	default:
	}
}

func (a *Attester) current() *config.LedgerAttestation {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.order
}

// Run makes an attempt at each order, and again every Retry while one stands and
// the last attempt neither attested nor found the work done, until ctx ends.
func (a *Attester) Run(ctx context.Context) {
	a.init()
	var retry <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-a.kick:
		case <-retry:
		}
		retry = nil
		o := a.current()
		if o == nil {
			continue
		}
		switch out, _ := a.Attempt(ctx, o); out {
		case LedgerFailed, StoreFailed, Elsewhere:
			// Elsewhere too: a claim whose holder dies expires, and this replica,
			// still fenced, tries again.
			retry = time.After(a.Retry)
		}
	}
}

// Attempt makes one attempt at order o and returns its outcome: Attested when this
// replica wrote the balances, or why it did not.
func (a *Attester) Attempt(ctx context.Context, o *config.LedgerAttestation) (string, error) {
	a.init()
	out, err := a.attempt(ctx, o)
	if out != Nothing {
		a.attempts.WithLabelValues(out).Inc()
	}
	switch {
	case out == Attested:
	case err != nil && out != Elsewhere:
		a.Log.Warn("Durable counters: not attested from the spend ledger; the fence stays", "result", out, "epoch", o.Epoch, "error", err)
	case err != nil:
		a.Log.Info("Durable counters: another replica attests them from the spend ledger", "epoch", o.Epoch, "detail", err)
	}
	return out, err
}

func (a *Attester) attempt(ctx context.Context, o *config.LedgerAttestation) (string, error) {
	ds, ok := a.Source.Durable()
	if !ok {
		return Nothing, nil
	}
	if out, err := lostUnder(ds.Epochs(), o.Epoch); out != "" {
		return out, err
	}
	rules, cachedWeight := a.Source.DurableRules()
	for _, r := range rules {
		if !answerable(r) {
			return Unanswerable, fmt.Errorf("rule %q counts by %s, which the ledger does not record: restore or attest its balances by hand (docs/runbooks.md)",
				r.Rule, dimOf(r))
		}
	}
	claimed, err := a.Store.ClaimAttestation(ctx, o.Epoch, ClaimTTL)
	if err != nil {
		return StoreFailed, err
	}
	if !claimed {
		return Elsewhere, errors.New("the claim is another replica's")
	}
	out, err := a.attestClaimed(ctx, ds, o, rules, cachedWeight)
	if out != Attested && out != Elsewhere {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), WriteTimeout)
		defer cancel()
		if rerr := a.Store.ReleaseAttestation(rctx); rerr != nil {
			a.Log.Warn("Durable counters: the claim on the attestation could not be released; it expires", "ttl", ClaimTTL, "error", rerr)
		}
	}
	return out, err
}

// attestClaimed attests under the claim: the balances summed from the ledger,
// written with a new epoch, unless the store holds a newer epoch already.
func (a *Attester) attestClaimed(ctx context.Context, ds budget.Durable, o *config.LedgerAttestation, rules []budget.DurableRule, cachedWeight float64) (string, error) {
	if held, err := a.Store.StoredEpoch(ctx); err != nil {
		return StoreFailed, err
	} else if later(held, o.Epoch) {
		return Elsewhere, fmt.Errorf("the store holds epoch %s, newer than the one lost: attested already", held)
	}
	start := time.Now()
	balances, err := Balances(ctx, a.Report, a.Fleet, rules, cachedWeight)
	if err != nil {
		return LedgerFailed, err
	}
	charges := make([]budget.Charge, 0, len(balances))
	for _, b := range balances {
		ch, err := a.Source.RestoreCharge(b)
		if err != nil {
			return StoreFailed, fmt.Errorf("balance of rule %q: %w", b.Rule, err)
		}
		charges = append(charges, ch)
	}
	wctx, cancel := context.WithTimeout(ctx, WriteTimeout)
	defer cancel()
	epoch, err := ds.Attest(wctx, charges)
	if err != nil {
		return StoreFailed, err
	}
	a.Log.Warn("Durable counters attested from the spend ledger: every live replica had flushed its settlements past the loss",
		"lost_epoch", o.Epoch, "epoch", epoch, "flushed_through", time.UnixMilli(o.FlushedThroughMillis).UTC(),
		"counters_restored", len(charges), "took", time.Since(start))
	return Attested, nil
}

// lostUnder says whether the store's fence is one order o may lift: a group fenced
// while the replica runs under epoch lost, because the store holds no epoch or an
// older one (its counters are gone, or older than the fleet's). A store check's
// fence, or a newer epoch (an attestation the config has not caught up with), is
// not. It returns "" when the fence may be lifted.
func lostUnder(groups []budget.GroupEpoch, lost string) (string, error) {
	for _, g := range groups {
		switch {
		case g.StoreFence != "":
			return StoreCheck, fmt.Errorf("group %s is fenced by a store check (%s): fix the store", g.Group, g.StoreFence)
		case !g.Fenced || g.Epoch != lost:
			continue
		case g.Found == "" || later(lost, g.Found):
			return "", nil
		}
	}
	return Nothing, nil
}

// later reports whether epoch a was created after epoch b (false when a is none).
func later(a, b string) bool {
	ta, ok := redisstore.EpochCreated(a)
	if !ok {
		return false
	}
	tb, _ := redisstore.EpochCreated(b)
	return ta.After(tb)
}
