// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

// Package settlement is what a settled request tells the observers of settlements
// (the metrics, the ledger): who sent it, what served it, what it used and cost.
package settlement

import (
	"time"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/proxy/usage"
)

// Outcome is how a request's reservation ended once its answer did.
type Outcome uint8

// The outcomes.
const (
	// Usage: settled on the usage the upstream reported, or counted in a cut stream.
	Usage Outcome = iota + 1
	// Reserved: charged the whole reservation (the answer could not be read).
	Reserved
	// Released: the upstream served nothing, and the reservation was given back.
	Released
	// Cached: answered by the response cache, a stored answer or a twin's call it
	// waited for: charged nothing, it saved what that answer used (Saved).
	Cached
)

var outcomeNames = [...]string{"", "settled", "reserved", "released", "cached"}

// String is the outcome's name, as the access log spells it.
func (o Outcome) String() string { return outcomeNames[o] }

// Request is one settled request. It is told once, for every charged request that was
// handed to an upstream, when its answer ends (a stream at its end or on a cut), and
// for every one the response cache answered whole (Cached).
type Request struct {
	// RequestID is the request's id (X-Tokenwarden-Request-Id); Route its charged path.
	RequestID string
	Route     string
	// APIKey is the key's name in the config, never its secret; User and Team are the
	// key's. All are empty for an anonymous request.
	APIKey, User, Team string
	// Tenant is the key's tenant (config api_keys[].tenant: the namespace of a tenant's
	// ApiKey); empty for the platform's own keys and anonymous requests.
	Tenant string
	// Model is the model the request was served as (a budget's fallback renames it),
	// and Known says the config names it (the models a bounded label may name).
	// Upstream is the upstream of the attempt that answered, and Attempts how many
	// upstreams were tried (more than one after a failover); empty and 0 for a
	// request the cache answered.
	Model    string
	Known    bool
	Upstream string
	Attempts int
	// Outcome says how the reservation ended; End how the answer's body ended.
	Outcome Outcome
	End     usage.End
	// Used is what the request was settled on (zero when released).
	Used budget.Used
	// Priced: the model has a price; then Dollars is what Used costs at it and
	// CostMicros the same in micro-dollars (budget.MicroDollars).
	Priced     bool
	Dollars    float64
	CostMicros int64
	// Saved is what the answer of a Cached request used when the upstream served it,
	// and SavedMicros what that costs at the model's price.
	Saved       budget.Used
	SavedMicros int64
	// Start is the request's arrival, HandedOff when it was handed to the upstream
	// (after any wait for capacity), Settled when its answer ended: all on the proxy's
	// clock.
	Start, HandedOff, Settled time.Time
}

// Observer is told of each settled request, on the request's goroutine: it must not
// block, and must not keep r past the call (copy what it needs).
type Observer interface {
	Settled(r *Request)
}

// Refuser is an observer that cannot record every settlement for a while (a spend
// ledger whose spool is full, under when_full: refuse). Refuse is asked once for each
// request that a cost budget governs, before it is handed to an upstream: true
// refuses it, and the observer counts it; retryAfter is what the client is told to
// wait. It must not block.
type Refuser interface {
	Refuse() (retryAfter time.Duration, refuse bool)
}

// Func is a function that observes settlements.
type Func func(r *Request)

// Settled implements Observer.
func (f Func) Settled(r *Request) { f(r) }
