// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package ledger

import (
	"strings"

	"github.com/tokenwarden/tokenwarden/proxy/settlement"
)

// Observer records each settled request in a ledger: a settlement.Observer, told on
// the request's goroutine, that only adds to the minute's row in memory.
type Observer struct {
	Ledger *Ledger
	// Fleet is the fleet's name in the record (config ledger.fleet: the operator's
	// namespace/name of the TokenProxy); its namespace is the tenant of the fleet's
	// own keys.
	Fleet string
}

// Settled implements settlement.Observer. A released request (the upstream served
// nothing, and no budget was charged) is not recorded.
func (o *Observer) Settled(r *settlement.Request) {
	if r.Outcome == settlement.Released {
		return
	}
	o.Ledger.Add(Record{
		Time: r.Settled,
		Dims: Dims{Fleet: o.Fleet, Tenant: tenantOf(o.Fleet, r.APIKey), APIKey: r.APIKey, User: r.User, Team: r.Team,
			Model: r.Model, Upstream: r.Upstream},
		Used: r.Used, CostMicros: r.CostMicros,
	})
}

// tenantOf is the namespace a key belongs to: the operator names a key of another
// namespace namespace_name, and one of the fleet's own namespace by its name alone.
// A standalone proxy's keys have no tenant.
func tenantOf(fleet, key string) string {
	if ns, _, ok := strings.Cut(key, "_"); ok {
		return ns
	}
	if ns, _, ok := strings.Cut(fleet, "/"); ok {
		return ns
	}
	return ""
}
