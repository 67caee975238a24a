// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package server

import (
	"context"
	"net/url"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/proxy/explain"
	"github.com/tokenwarden/tokenwarden/proxy/upstream"
)

// Explain is every budget that applies to a key's requests for a model on a route,
// with the attributes the query names, by the config in force and the limiter's own
// resolution (GET /admin/explain).
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
	id := budget.Identity{Key: key, Model: q.Model, Endpoint: route.endpoint,
		Session: q.Session, Agent: q.Agent, Task: q.Task, Run: q.Run, Fingerprint: q.Fingerprint}
	up := s.explainedUpstream(rt, q, route)
	if q.Upstream != "" && up == nil {
		return explain.Answer{}, explain.ErrUnknownUpstream
	}
	if up != nil {
		id.Upstream, id.Provider = providerOf(up, route.family)
	}
	e := s.limiter.Explain(ctx, rt.policy, id, route.charged)
	a := explain.Answer{Generation: rt.cfg.Generation, Route: route.name, Explanation: e}
	a.Attributes = explainedAttributes(&id)
	return a, nil
}

// explainedUpstream is the upstream the query names, among the model's candidates
// (or the upstream that routes it), or the one the model's request goes to first now.
func (s *Server) explainedUpstream(rt *runtime, q explain.Query, route route) *upstream.Upstream {
	mr := rt.Models[q.Model]
	if mr == nil || len(mr.Candidates) == 0 {
		up := rt.Route(q.Model)
		if q.Upstream != "" && (up == nil || up.Name != q.Upstream) {
			return nil
		}
		return up
	}
	if q.Upstream == "" {
		if i, _, _ := mr.Pick(0, route.family, s.clock.Now(), false); i >= 0 {
			return mr.Candidates[i].Up
		}
		return nil
	}
	for _, c := range mr.Candidates {
		if c.Up.Name == q.Upstream {
			return c.Up
		}
	}
	return nil
}

// explainedAttributes are the identity's attributes beyond the key, as rules name
// them: those it has.
func explainedAttributes(id *budget.Identity) map[string]string {
	out := map[string]string{}
	for _, kv := range [...][2]string{
		{"provider", id.Provider}, {"upstream", id.Upstream}, {"endpoint", id.Endpoint},
		{"session", id.Session}, {"agent", id.Agent}, {"task", id.Task}, {"run", id.Run},
		{"request_fingerprint", id.Fingerprint},
	} {
		if kv[1] != "" {
			out[kv[0]] = kv[1]
		}
	}
	if id.Key != nil && id.Key.Environment != "" {
		out["environment"] = id.Key.Environment
	}
	return out
}
