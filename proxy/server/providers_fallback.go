// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package server

import (
	"context"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/proxy/upstream"
)

// FallbackHeader says, on an answer served by a fallback model, which model was asked
// for, which served, and why: "fallback(gpt-4o -> gpt-4o-mini, budget)".
const FallbackHeader = "X-Tokenwarden-Fallback"

// fallback tries the refusing rule's fallback model for a request a model-scoped
// budget refused: the fallback must fit its own context window, have an upstream that
// is up, and be admitted by its own budgets (which it is then charged to; an
// identity's budget still refuses it). It returns the fallback's decision, or dec
// unchanged when no fallback serves.
func (s *Server) fallback(ctx context.Context, ex *exchange, id budget.Identity, ask budget.Ask, dec budget.Decision) budget.Decision {
	if ex.try.Fallback != "" {
		// Substituted before any attempt already: a request moves once.
		return dec
	}
	from := ex.est.Model
	to, mr, up, ok := ex.rt.Fallback(dec.Refusal.Rule, from, ex.est.InputLower, ex.est.OutputCap, ex.route.family, s.clock.Now())
	if !ok {
		return dec
	}
	id.Model, id.Upstream = to, up.Name
	if up.Provider != "" {
		id.Provider = string(up.Provider)
	}
	next, err := s.limiter.Admit(ctx, ex.rt.policy, id, ask)
	if err != nil || next.Refusal != nil {
		if next.Hold != nil {
			next.Hold.Release()
		}
		return dec
	}
	try := upstream.Attempt{Model: mr, Body: ex.try.Body, Rename: to}
	try.Fallback = "fallback(" + from + " -> " + to + ", budget)"
	ex.try, ex.upstream, ex.est.Model = try, up, to
	label := "other"
	if ex.rt.knownModels[from] {
		label = from
	}
	s.metrics.Providers.Fallbacks.WithLabelValues(label, to).Inc()
	return next
}
