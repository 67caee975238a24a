// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package server

import (
	"encoding/json"
	"net/http"
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
	// Limit is token_budget, requests, rule or queue.
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
}

// KeyRefusals are one API key's last refusals, newest first. An empty APIKey holds the
// anonymous callers'.
type KeyRefusals struct {
	APIKey   string           `json:"api_key"`
	Refusals []AuditedRefusal `json:"refusals"`
}

// audit keeps each API key's last refusals in a ring of refusal_audit.per_key.
type audit struct {
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

// add keeps a refused request's refusal under its key.
func (a *audit) add(rt *runtime, ex *exchange) {
	n := rt.cfg.Observability.RefusalAudit.Kept()
	if n == 0 {
		return
	}
	rec := &ex.rec
	e := AuditedRefusal{
		Time: rec.start.UTC(), RequestID: rec.requestID, Route: rec.route, Model: rec.model,
		TokensReserved: ex.est.Total(), RetryAfterSeconds: rec.retryAfterSecond, Message: rec.errMsg,
	}
	if r := rec.refusal; r != nil && !rec.queue {
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
	} else {
		e.Limit = "queue"
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.rings == nil {
		a.rings = map[string]*ring{}
	}
	r := a.rings[ex.key]
	if r == nil {
		r = &ring{}
		a.rings[ex.key] = r
	}
	r.add(e, n)
}

// prune drops the refusals of keys the config no longer names, and all of them when
// the audit is off.
func (a *audit) prune(rt *runtime) {
	off := rt.cfg.Observability.RefusalAudit.Kept() == 0
	a.mu.Lock()
	defer a.mu.Unlock()
	for name := range a.rings {
		if off || (name != "" && rt.policy.Key(name) == nil) {
			delete(a.rings, name)
		}
	}
}

// Refusals returns the last refusals of the key named (every key's when name is
// empty and all is true), keys in name order.
func (s *Server) Refusals(name string, all bool) []KeyRefusals {
	a := &s.audit
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

// refusalsHandler serves GET /admin/refusals: every key's last refusals, or with
// ?api_key=NAME one key's (?api_key= alone: the anonymous callers').
func (s *Server) refusalsHandler(w http.ResponseWriter, r *http.Request) {
	name, one := r.URL.Query()["api_key"]
	var key string
	if one && len(name) > 0 {
		key = name[0]
	}
	out := s.Refusals(key, !one)
	if one && len(out) == 0 {
		out = append(out, KeyRefusals{APIKey: key, Refusals: []AuditedRefusal{}})
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(map[string]any{"api_keys": out})
}
