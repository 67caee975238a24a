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
	// namespace/name of the TokenProxy).
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
		Dims: Dims{Fleet: o.Fleet, Tenant: tenantOf(r.APIKey), APIKey: r.APIKey, User: r.User, Team: r.Team,
			Model: r.Model, Upstream: r.Upstream},
		Used: r.Used, CostMicros: r.CostMicros,
	})
}

// tenantOf is the tenant a key belongs to, as the config's api_keys[].tenant says:
// the operator names a key of a tenant namespace namespace_name; a key of the
// fleet's own namespace (the platform's) and a standalone proxy's keys have none.
func tenantOf(key string) string {
	if ns, _, ok := strings.Cut(key, "_"); ok {
		return ns
	}
	return ""
}
