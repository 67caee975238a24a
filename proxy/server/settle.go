// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package server

import (
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/tokenwarden/tokenwarden/proxy/accesslog"
	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/proxy/metrics"
	"github.com/tokenwarden/tokenwarden/proxy/refusal"
	"github.com/tokenwarden/tokenwarden/proxy/settlement"
	"github.com/tokenwarden/tokenwarden/proxy/usage"
)

// settlementObservers are what is told of each settled request, in order: the usage
// and spend metrics, the usage of the key's team, then the Options' own (a ledger).
func (s *Server) settlementObservers(extra []settlement.Observer) []settlement.Observer {
	own := []settlement.Observer{usageMetrics{s.metrics}, teamUsage{s.metrics}}
	return append(own, extra...)
}

// settle ends a forwarded request on what it used (settlement.Usage), or on its whole
// reservation (settlement.Reserved): its upstream's capacity and its agent limits are
// given the tokens served, its hold is settled, and the observers are told.
func (s *Server) settle(ex *exchange, u usage.Usage, out settlement.Outcome) {
	ex.rec.Used, ex.rec.Settlement = u, accesslog.SettledUsage
	if out == settlement.Reserved {
		ex.rec.Settlement = accesslog.SettledReserved
	}
	ex.slot.Done(u.Input, u.Output)
	s.agents.Settle(&ex.agent, u.Input+u.Output)
	used := budget.Used{Input: u.Input, Output: u.Output, Cached: u.Cached}
	if ex.hold.SettleTo(used, ex) {
		ex.settling = true
		s.metrics.Settled()
	}
	s.tell(ex, out, used)
}

// release ends a request that served nothing: its capacity and hold are given back
// uncharged. A forwarded request's observers are told, once.
func (s *Server) release(ex *exchange) {
	ex.slot.Done(0, 0)
	s.agents.Release(&ex.agent)
	if ex.hold.Release() {
		ex.rec.Settlement = accesslog.Released
		s.metrics.Released()
	}
	if ex.rec.Upstream != "" {
		s.tell(ex, settlement.Released, budget.Used{})
	}
}

// told holds what the observers are told, between requests: an observer keeps
// nothing of it past its call (settlement.Observer), so a request's state need not.
var told = sync.Pool{New: func() any { return new(settlement.Request) }}

// tell tells the observers of a charged request's settlement, once: what it used and
// cost, by whom, served where and when.
func (s *Server) tell(ex *exchange, out settlement.Outcome, used budget.Used) {
	if ex.told || !ex.route.charged {
		return
	}
	ex.told = true
	st, rec := told.Get().(*settlement.Request), &ex.rec
	st.RequestID, st.Route, st.Attempts = rec.RequestID, ex.route.name, ex.attempts
	st.APIKey, st.User, st.Team = rec.APIKey, rec.User, rec.Team
	if ex.key != nil {
		st.Tenant = ex.key.Tenant
	}
	st.Model, st.Upstream, st.Known = ex.est.Model, rec.Upstream, ex.rt.knownModels[ex.est.Model]
	st.Outcome, st.End, st.Used = out, rec.End, used
	if out == settlement.Cached {
		st.Saved, st.Used = used, budget.Used{}
		dollars, _ := ex.rt.policy.Cost(ex.est.Model, used)
		st.SavedMicros = budget.MicroDollars(dollars)
	}
	st.Dollars, st.Priced = ex.rt.policy.Cost(ex.est.Model, st.Used)
	st.CostMicros = budget.MicroDollars(st.Dollars)
	st.Start, st.HandedOff, st.Settled = rec.Start, rec.UpstreamStart, s.clock.Now()
	for _, o := range s.observers {
		o.Settled(st)
	}
	*st = settlement.Request{}
	told.Put(st)
}

// tellCached tells the observers of a request the response cache answered whole (a
// stored answer, or a twin's call it waited for): it cost nothing and saved u.
func (s *Server) tellCached(ex *exchange, u usage.Usage) {
	s.tell(ex, settlement.Cached, budget.Used{Input: u.Input, Output: u.Output, Cached: u.Cached})
}

// refusersOf are the observers that may ask for requests to be refused.
func refusersOf(observers []settlement.Observer) []settlement.Refuser {
	var out []settlement.Refuser
	for _, o := range observers {
		if r, ok := o.(settlement.Refuser); ok {
			out = append(out, r)
		}
	}
	return out
}

// recordable refuses a request that a cost budget governs while an observer cannot
// record it (a spend ledger whose spool is full, under when_full: refuse): 503 with
// Retry-After, counted and audited. Others are served, and the response cache's
// answers, which cost nothing, were served before.
func (s *Server) recordable(ex *exchange) bool {
	if len(s.refusers) == 0 || !ex.hold.Costs() {
		return true
	}
	for _, r := range s.refusers {
		if wait, refuse := r.Refuse(); refuse {
			return ex.unrecordable(wait)
		}
	}
	return true
}

// unrecordable answers 503 spend_unrecordable: the spend ledger cannot record the
// request's cost now.
func (ex *exchange) unrecordable(wait time.Duration) bool {
	secs := int64(max(1, wait.Round(time.Second)/time.Second))
	ex.rec.Decision, ex.rec.LedgerFull, ex.rec.RetryAfterSecond = accesslog.Refused, true, secs
	ex.w.Header().Set("Retry-After", strconv.FormatInt(secs, 10))
	details := map[string]any{"retry_after_seconds": secs, "retryable": true}
	return ex.fail(http.StatusServiceUnavailable, "spend_unrecordable",
		"the spend ledger cannot record this request's cost: its database is unreachable and this proxy's spool is full; "+
			"requests that a cost budget governs are refused until it drains; retry later",
		&refusal.Body{LimitType: "ledger", Details: details})
}

// usageMetrics counts what a settled request used and cost, by model (a model the
// config does not name is "other", so the label stays bounded) and key.
type usageMetrics struct{ m *metrics.Metrics }

func (o usageMetrics) Settled(r *settlement.Request) {
	if r.Outcome == settlement.Released || r.Outcome == settlement.Cached {
		return
	}
	if r.Priced {
		o.m.AddSpend(r.Model, r.Dollars)
	}
	model := "other"
	if r.Known {
		model = r.Model
	}
	o.m.AddUsage(model, r.APIKey, r.Used.Input, r.Used.Output)
}

// teamUsage counts the tokens served to the request's key's team.
type teamUsage struct{ m *metrics.Metrics }

func (o teamUsage) Settled(r *settlement.Request) {
	if (r.Outcome == settlement.Usage || r.Outcome == settlement.Reserved) && r.APIKey != "" && r.Team != "" {
		o.m.Agents.AddTeamUsage(r.Team, r.Used.Input, r.Used.Output)
	}
}
