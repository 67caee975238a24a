// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package server

import (
	"context"
	"net/url"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/proxy/explain"
)

// Explain is every budget that applies to a key's requests for a model on a route,
// by the config in force and the limiter's own resolution (GET /admin/explain).
func (s *Server) Explain(ctx context.Context, q explain.Query) (explain.Answer, error) {
	rt := s.rt.Load()
	if rt == nil {
		return explain.Answer{}, explain.ErrNoConfig
	}
	key := rt.policy.Key(q.APIKey)
	if key == nil {
		return explain.Answer{}, explain.ErrUnknownKey
	}
	route := classify(&url.URL{Path: q.Route})
	e := s.limiter.Explain(ctx, rt.policy, budget.Identity{Key: key, Model: q.Model}, route.charged)
	return explain.Answer{Generation: rt.cfg.Generation, Route: route.name, Explanation: e}, nil
}
