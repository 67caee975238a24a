// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package server

import (
	"encoding/json"
	"slices"

	"github.com/tokenwarden/tokenwarden/proxy/upstream"
)

// ReportedHealth is one upstream's health in the replica's report to the control
// plane (report.UpstreamHealthAnnotation).
type ReportedHealth struct {
	Upstream string `json:"upstream"`
	// Breaker is closed, open or half_open.
	Breaker string `json:"breaker"`
	// Cooling is true while the upstream's credential cools after a 429.
	Cooling bool `json:"cooling,omitempty"`
}

// HealthReport is the model registry's upstreams' health as this replica sees it, as
// JSON for its report Lease; "" without a registry.
func (s *Server) HealthReport() string {
	rt := s.rt.Load()
	if rt == nil {
		return ""
	}
	now := s.clock.Now()
	var out []ReportedHealth
	for _, u := range s.upstreamHealth() {
		i := slices.IndexFunc(rt.Upstreams, func(up *upstream.Upstream) bool { return up.Name == u.Upstream })
		out = append(out, ReportedHealth{Upstream: u.Upstream, Breaker: u.State,
			Cooling: i >= 0 && s.health.Cooldown(rt.Upstreams[i].CredKey).Cooling(now)})
	}
	if len(out) == 0 {
		return ""
	}
	b, err := json.Marshal(out)
	if err != nil {
		return ""
	}
	return string(b)
}
