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
	// Cooling is true while the upstream's credential is out: Reason says why (rate
	// or billing), with the provider's message and the intervals asked for and
	// applied, in seconds.
	Cooling          bool    `json:"cooling,omitempty"`
	Reason           string  `json:"reason,omitempty"`
	Message          string  `json:"message,omitempty"`
	RequestedSeconds float64 `json:"requested_seconds,omitempty"`
	AppliedSeconds   float64 `json:"applied_seconds,omitempty"`
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
		r := ReportedHealth{Upstream: u.Upstream, Breaker: u.State}
		i := slices.IndexFunc(rt.Upstreams, func(up *upstream.Upstream) bool { return up.Name == u.Upstream })
		if i >= 0 {
			if c, ok := s.health.Cooldown(rt.Upstreams[i].CredKey).State(now); ok {
				r.Cooling, r.Reason, r.RequestedSeconds, r.AppliedSeconds = true, string(c.Reason), c.Requested.Seconds(), c.Applied.Seconds()
				r.Message = c.Message
			}
		}
		out = append(out, r)
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
