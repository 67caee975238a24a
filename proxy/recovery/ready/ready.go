// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

// Package ready decides, from what the live replicas of a fleet report, when their
// lost durable counters may be attested from the spend ledger: the control plane's
// half of proxy/recovery, with no store or database of its own.
package ready

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/proxy/config"
)

// InFlightGrace is how long after the loss a replica's ledger must be flushed past:
// a request admitted just before the loss settles within it, so its spend is in the
// sum. A request still open after it (a long stream) settles on the attested counter
// without its reservation, which is the bound of what an attestation can miss.
const InFlightGrace = 30 * time.Second

// NoLoss is Order's answer when no live replica has lost its durable counters.
const NoLoss = "no replica has lost its durable counters"

// Replica is what one live replica reports (its Lease).
type Replica struct {
	Name   string
	Epochs []budget.GroupEpoch
	// Ledger: the replica reports a ledger; FlushedThrough is when its last flush
	// that left the spool empty started (zero before one).
	Ledger         bool
	FlushedThrough time.Time
}

// Order is the fleet's word that its lost counters may be attested from the ledger,
// or nil and why not. It is given when a live replica is fenced because its store
// holds none or an older one of the epoch it runs under, no replica is fenced by a
// store check, and every live replica has flushed its ledger past the first fence
// plus grace. The order names the least flushed-through time.
func Order(live []Replica, grace time.Duration) (*config.LedgerAttestation, string) {
	lost, lostAt := "", int64(0)
	for _, r := range live {
		for _, g := range r.Epochs {
			switch {
			case g.StoreFence != "":
				return nil, fmt.Sprintf("replica %s is fenced by a store check (%s), which no record lifts", r.Name, g.StoreFence)
			case !g.Fenced || (g.Found != "" && !before(g.Found, g.Epoch)):
				continue
			case lost != "" && g.Epoch != lost:
				return nil, fmt.Sprintf("the replicas run under different epochs (%s, %s)", lost, g.Epoch)
			case g.FencedAt <= 0:
				return nil, fmt.Sprintf("replica %s reports no time for its fence", r.Name)
			}
			lost = g.Epoch
			if lostAt == 0 || g.FencedAt < lostAt {
				lostAt = g.FencedAt
			}
		}
	}
	if lost == "" {
		return nil, NoLoss
	}
	need := time.UnixMilli(lostAt).Add(grace)
	var through time.Time
	for _, r := range live {
		switch {
		case !r.Ledger:
			return nil, fmt.Sprintf("replica %s reports no spend ledger", r.Name)
		case r.FlushedThrough.Before(need):
			return nil, fmt.Sprintf("replica %s has flushed its ledger only through %s, not past %s (the loss and %s)",
				r.Name, stamp(r.FlushedThrough), stamp(need), grace)
		}
		if through.IsZero() || r.FlushedThrough.Before(through) {
			through = r.FlushedThrough
		}
	}
	return &config.LedgerAttestation{Epoch: lost, FlushedThroughMillis: through.UnixMilli()}, ""
}

func stamp(t time.Time) string {
	if t.IsZero() {
		return "never"
	}
	return t.UTC().Format(time.RFC3339)
}

// before reports whether epoch a was created before epoch b.
func before(a, b string) bool { return created(a) < created(b) }

// created is an epoch's creation in Unix milliseconds; 0 when it has not the form.
func created(e string) int64 {
	ms, _, _ := strings.Cut(e, "-")
	n, err := strconv.ParseInt(ms, 10, 64)
	if err != nil {
		return 0
	}
	return n
}
