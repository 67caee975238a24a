// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package accesslog

import (
	"slices"
	"strings"
	"sync"
	"time"
)

// AuditedRefusal is one refusal as /admin/refusals shows it: what refused, what the
// request asked, and, for the caller's own budgets only, what was left. A shared
// budget's level and a shared rule's name are never kept.
type AuditedRefusal struct {
	Time      time.Time `json:"time"`
	RequestID string    `json:"request_id"`
	Route     string    `json:"route"`
	Model     string    `json:"model,omitempty"`
	// Limit is token_budget, requests, rule, queue or ledger.
	Limit     string `json:"limit"`
	Dimension string `json:"dimension,omitempty"`
	// Period is the token budget's period (tokens_minute, tokens_day).
	Period string `json:"period,omitempty"`
	// Rule is the caller's own rule; Window the refusing window of any rule.
	Rule   string `json:"rule,omitempty"`
	Window string `json:"window,omitempty"`
	// TokensReserved is the request's reservation (input estimate plus output
	// ceiling); Asked is what it asked of the refusing bucket, in that bucket's units.
	TokensReserved int64   `json:"tokens_reserved"`
	Asked          float64 `json:"asked"`
	// Capacity and Remaining are the refusing bucket's, when it is the caller's own.
	Capacity  *float64 `json:"capacity,omitempty"`
	Remaining *float64 `json:"remaining,omitempty"`
	// RetryAfterSeconds is the Retry-After the client got; LargerThanBudget is true
	// when no wait lets the request in.
	RetryAfterSeconds int64 `json:"retry_after_seconds"`
	LargerThanBudget  bool  `json:"larger_than_budget,omitempty"`
	// Message is the error message the client got.
	Message string `json:"message"`
	// Tenant is the tenant the key belonged to in the config the request was decided
	// under; empty for the platform's keys and the anonymous callers. A tenant's read
	// of the audit is scoped by it, whatever the config says of the key since.
	Tenant string `json:"tenant,omitempty"`
}

// KeyRefusals are one API key's last refusals, newest first. An empty APIKey holds the
// anonymous callers'.
type KeyRefusals struct {
	APIKey   string           `json:"api_key"`
	Refusals []AuditedRefusal `json:"refusals"`
}

// Audit keeps each API key's last refusals in a ring of refusal_audit.per_key.
type Audit struct {
	mu    sync.Mutex
	rings map[string]*ring
}

type ring struct {
	entries []AuditedRefusal
	next    int
	full    bool
}

func (r *ring) add(e AuditedRefusal, n int) {
	if len(r.entries) != n {
		// A reload changed the bound: keep the newest that fit.
		kept := r.newest()
		if len(kept) > n {
			kept = kept[:n]
		}
		slices.Reverse(kept)
		r.entries, r.next, r.full = make([]AuditedRefusal, n), 0, false
		for _, k := range kept {
			r.put(k)
		}
	}
	r.put(e)
}

func (r *ring) put(e AuditedRefusal) {
	r.entries[r.next] = e
	r.next++
	if r.next == len(r.entries) {
		r.next, r.full = 0, true
	}
}

// newest returns a copy of the entries, newest first.
func (r *ring) newest() []AuditedRefusal {
	out := make([]AuditedRefusal, 0, len(r.entries))
	for i := r.next - 1; i >= 0; i-- {
		out = append(out, r.entries[i])
	}
	if r.full {
		for i := len(r.entries) - 1; i >= r.next; i-- {
			out = append(out, r.entries[i])
		}
	}
	return out
}

// Add keeps a refused request's refusal under its key (empty: anonymous) and the
// key's tenant, in a ring of n (none when n is 0); tokens is the request's
// reservation.
func (a *Audit) Add(rec *Record, key, tenant string, tokens int64, n int) {
	if n == 0 {
		return
	}
	e := AuditedRefusal{
		Time: rec.Start.UTC(), RequestID: rec.RequestID, Route: rec.Route, Model: rec.Model,
		TokensReserved: tokens, RetryAfterSeconds: rec.RetryAfterSecond, Message: rec.ErrMsg, Tenant: tenant,
	}
	switch r := rec.Refusal; {
	case rec.LedgerFull:
		e.Limit = "ledger"
	case r != nil && !rec.Queue:
		e.Dimension, e.Asked, e.LargerThanBudget = r.Dimension.String(), r.Asked, r.LargerThanBucket
		switch {
		case r.Rule != "":
			e.Limit, e.Window = "rule", r.Window
			if r.Scoped {
				e.Rule = r.Rule
			}
		case r.Requests:
			e.Limit = "requests"
		default:
			e.Limit, e.Period = "token_budget", r.Period.String()
		}
		switch {
		case r.Bucket.Present:
			c, left := float64(r.Bucket.Limit), float64(r.Bucket.Remaining)
			e.Capacity, e.Remaining = &c, &left
		case r.Cost.Present:
			c, left := r.Cost.Limit, r.Cost.Remaining
			e.Capacity, e.Remaining = &c, &left
		}
	default:
		e.Limit = "queue"
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.rings == nil {
		a.rings = map[string]*ring{}
	}
	r := a.rings[key]
	if r == nil {
		r = &ring{}
		a.rings[key] = r
	}
	r.add(e, n)
}

// Prune drops the refusals of keys that named reports gone, and all of them when the
// audit is off.
func (a *Audit) Prune(off bool, named func(key string) bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for name := range a.rings {
		if off || (name != "" && !named(name)) {
			delete(a.rings, name)
		}
	}
}

// Refusals returns the last refusals of the key named (every key's when name is
// empty and all is true), keys in name order.
func (a *Audit) Refusals(name string, all bool) []KeyRefusals {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := []KeyRefusals{}
	for k, r := range a.rings {
		if all || k == name {
			out = append(out, KeyRefusals{APIKey: k, Refusals: r.newest()})
		}
	}
	slices.SortFunc(out, func(x, y KeyRefusals) int { return strings.Compare(x.APIKey, y.APIKey) })
	return out
}
