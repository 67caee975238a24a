// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package controllers

import (
	"encoding/json"
	"fmt"
	"slices"

	twv1alpha1 "github.com/tokenwarden/tokenwarden/api/v1alpha1"
)

// reportedHealth is one upstream's health in a replica's Lease
// (ReplicaUpstreamHealthAnnotation).
type reportedHealth struct {
	Upstream string `json:"upstream"`
	Breaker  string `json:"breaker"`
	Cooling  bool   `json:"cooling"`
}

// parseHealth reads a Lease's ReplicaUpstreamHealthAnnotation; a value that does not
// parse reports nothing.
func parseHealth(v string) []reportedHealth {
	if v == "" {
		return nil
	}
	var out []reportedHealth
	if err := json.Unmarshal([]byte(v), &out); err != nil {
		return nil
	}
	return out
}

// setUpstreamHealth sets status.upstreams ("healthy/total") and
// status.unhealthyUpstreams from the live replicas' reports: an upstream of the
// spec is unhealthy while a live replica reports its breaker not closed or its
// credential cooling. A fleet without a model registry tracks no health and shows
// none.
func setUpstreamHealth(st *twv1alpha1.TokenProxyStatus, tp *twv1alpha1.TokenProxy, rs *reports) {
	if !slices.ContainsFunc(tp.Spec.Models, func(m twv1alpha1.ModelSpec) bool { return len(m.Upstreams) > 0 }) {
		st.Upstreams, st.UnhealthyUpstreams = "", nil
		return
	}
	bad := map[string]*twv1alpha1.UnhealthyUpstream{}
	for _, rr := range rs.live {
		for _, h := range rr.health {
			open := h.Breaker != "" && h.Breaker != "closed"
			if !open && !h.Cooling {
				continue
			}
			u := bad[h.Upstream]
			if u == nil {
				u = &twv1alpha1.UnhealthyUpstream{Name: h.Upstream}
				bad[h.Upstream] = u
			}
			if open {
				u.OpenReplicas++
			}
			if h.Cooling {
				u.CoolingReplicas++
			}
		}
	}
	st.UnhealthyUpstreams = nil
	healthy := 0
	for _, up := range tp.Spec.Upstreams {
		if u := bad[up.Name]; u != nil {
			st.UnhealthyUpstreams = append(st.UnhealthyUpstreams, *u)
			continue
		}
		healthy++
	}
	st.Upstreams = fmt.Sprintf("%d/%d", healthy, len(tp.Spec.Upstreams))
}
