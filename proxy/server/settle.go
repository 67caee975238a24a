// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package server

import (
	"github.com/tokenwarden/tokenwarden/proxy/accesslog"
	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/proxy/metrics"
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

// tell tells the observers of a charged request's settlement, once: what it used and
// cost, by whom, served where and when.
func (s *Server) tell(ex *exchange, out settlement.Outcome, used budget.Used) {
	if ex.told || !ex.route.charged {
		return
	}
	ex.told = true
	st, rec := &ex.settled, &ex.rec
	st.RequestID, st.Route = rec.RequestID, ex.route.name
	st.APIKey, st.User, st.Team = rec.APIKey, rec.User, rec.Team
	st.Model, st.Upstream, st.Known = ex.est.Model, rec.Upstream, ex.rt.knownModels[ex.est.Model]
	st.Outcome, st.End, st.Used = out, rec.End, used
	st.Dollars, st.Priced = ex.rt.policy.Cost(ex.est.Model, used)
	st.CostMicros = budget.MicroDollars(st.Dollars)
	st.Start, st.HandedOff, st.Settled = rec.Start, rec.UpstreamStart, s.clock.Now()
	for _, o := range s.observers {
		o.Settled(st)
	}
}

// usageMetrics counts what a settled request used and cost, by model (a model the
// config does not name is "other", so the label stays bounded) and key.
type usageMetrics struct{ m *metrics.Metrics }

func (o usageMetrics) Settled(r *settlement.Request) {
	if r.Outcome == settlement.Released {
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
	if r.Outcome != settlement.Released && r.APIKey != "" && r.Team != "" {
		o.m.Agents.AddTeamUsage(r.Team, r.Used.Input, r.Used.Output)
	}
}
