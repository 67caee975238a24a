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
)

var outcomeNames = [...]string{"", "settled", "reserved", "released"}

// String is the outcome's name, as the access log spells it.
func (o Outcome) String() string { return outcomeNames[o] }

// Request is one settled request. It is told once, for every charged request that was
// handed to an upstream, when its answer ends (a stream at its end or on a cut).
type Request struct {
	// RequestID is the request's id (X-Tokenwarden-Request-Id); Route its charged path.
	RequestID string
	Route     string
	// APIKey is the key's name in the config, never its secret; User and Team are the
	// key's. All are empty for an anonymous request.
	APIKey, User, Team string
	// Model is the model the request was served as (a budget's fallback renames it),
	// and Known says the config names it (the models a bounded label may name).
	// Upstream is the upstream of the attempt that answered, and Attempts how many
	// upstreams were tried (more than one after a failover).
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

// Func is a function that observes settlements.
type Func func(r *Request)

// Settled implements Observer.
func (f Func) Settled(r *Request) { f(r) }
