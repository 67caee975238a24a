// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

// Package accesslog is what the proxy tells of each request: the record a request
// leaves, the writer that formats records into JSON lines off the request path, and the
// audit of each key's last refusals.
package accesslog

import (
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/proxy/usage"
)

// Decision is what admission did with a request, as the access log and traces name it.
type Decision uint8

// The decisions.
const (
	// Rejected is a request answered before admission (authentication, a bad body, no
	// upstream, an unreachable store).
	Rejected Decision = iota
	Admitted
	Refused
	Exempt
	FailedOpen
)

var decisionNames = [...]string{"rejected", "admitted", "refused", "exempt", "failed_open"}

// String is the decision's name in the access log and traces.
func (d Decision) String() string { return decisionNames[d] }

// Settlement is how a request's hold ended.
type Settlement uint8

// The settlements.
const (
	NotSettled Settlement = iota
	// SettledUsage is a settlement on the usage the backend reported, or counted in a
	// cut stream.
	SettledUsage
	// SettledReserved charged the whole reservation (the body was unreadable).
	SettledReserved
	// Released gave the whole reservation back.
	Released
)

var settlementNames = [...]string{"", "settled", "reserved", "released"}

// String is the settlement's name in the access log and traces; empty when not settled.
func (s Settlement) String() string { return settlementNames[s] }

// Record is what one request leaves for the access log. It lives in the request's
// state and is copied by value into the log's buffer: the log costs the request no
// allocation of its own.
type Record struct {
	Start     time.Time
	RequestID string
	Method    string
	Client    string
	Decision  Decision
	ErrCode   string
	ErrMsg    string
	Refusal   *budget.Refusal
	Queue     bool
	// LedgerFull: refused because the spend ledger could not record the request
	// (its spool full, under when_full: refuse).
	LedgerFull bool
	Settlement Settlement
	End        usage.End
	Used       usage.Usage
	// Debt and DebtDollars are what the settlement put into debt (budget.Settlement),
	// told by the store once it has settled.
	Debt, DebtDollars float64
	// Unlogged: sampling or the config leaves the request out of the access log.
	Unlogged bool
	// Start and Finished are the request's arrival and end; UpstreamStart and
	// UpstreamHeaders time the upstream call of its last attempt: forwarded, answered.
	// All come from the server's clock.
	UpstreamStart   time.Time
	UpstreamHeaders time.Time
	UpstreamID      string
	Finished        time.Time
	BytesIn         int64
	BytesOut        int64
	Status          int
	Route           string
	Model           string
	APIKey          string
	User, Team      string
	// Upstream is the upstream the request was last handed to; empty when nothing
	// was forwarded.
	Upstream string
	Reserved int64
	// OutputAdmitted is the output the model's context admission lets the request
	// have: its output cap as forwarded (lowered, under clamp), or what the window
	// leaves after the input for a request that states none; 0 when the model sets no
	// limit. It is not the reservation, which Reserved is.
	OutputAdmitted int64
	TraceID        trace.TraceID
	// Cache is how the response cache answered (hit, miss, coalesced, bypass); empty
	// when the cache is off or the request was not one it serves.
	Cache string
	// CacheAge is a hit's entry's age in seconds, as its Age header says.
	CacheAge         int64
	RetryAfterSecond int64
}
