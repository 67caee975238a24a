// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package ledger

import (
	"time"

	"github.com/tokenwarden/tokenwarden/proxy/settlement"
)

// Observer records each settled request in a ledger: a settlement.Observer, told on
// the request's goroutine, that only adds to the minute's row in memory.
type Observer struct {
	Ledger *Ledger
	// Fleet is the fleet's name in the record (config ledger.fleet: the operator's
	// namespace/name of the TokenProxy).
	Fleet string
}

// Settled implements settlement.Observer. A released request (the upstream served
// nothing, and no budget was charged) is not recorded; one the response cache
// answered is a request that cost nothing, with what it saved.
func (o *Observer) Settled(r *settlement.Request) {
	if r.Outcome == settlement.Released {
		return
	}
	rec := Record{
		Time: r.Settled,
		Dims: Dims{Fleet: o.Fleet, Tenant: r.Tenant, APIKey: r.APIKey, User: r.User, Team: r.Team,
			Model: r.Model, Upstream: r.Upstream},
		Used: r.Used, CostMicros: r.CostMicros,
	}
	if r.Outcome == settlement.Cached {
		rec.CacheHit, rec.Saved, rec.SavedMicros = true, r.Saved, r.SavedMicros
	}
	o.Ledger.Add(rec)
}

// Refuse implements settlement.Refuser (Ledger.Refuse).
func (o *Observer) Refuse() (time.Duration, bool) { return o.Ledger.Refuse() }
