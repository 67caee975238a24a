// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package controllers

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	twv1alpha1 "github.com/tokenwarden/tokenwarden/api/v1alpha1"
)

// reportedHealth is one upstream's health in a replica's Lease
// (ReplicaUpstreamHealthAnnotation).
type reportedHealth struct {
	Upstream string `json:"upstream"`
	Breaker  string `json:"breaker"`
	Cooling  bool   `json:"cooling"`
	// Reason is why it cools: rate or billing (absent from a replica of before
	// billing cooldowns: rate); Message and the intervals are the cooldown's.
	Reason           string  `json:"reason"`
	Message          string  `json:"message"`
	RequestedSeconds float64 `json:"requested_seconds"`
	AppliedSeconds   float64 `json:"applied_seconds"`
}

// What keeps an upstream out, the gravest first.
const (
	outBilling = "Billing"
	outBreaker = "Breaker"
	outRate    = "Rate"
)

// gravity orders the reasons: the gravest is the one status names.
var gravity = map[string]int{outBilling: 3, outBreaker: 2, outRate: 1}

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

// setUpstreamHealth sets status.upstreams ("healthy/total"), status.upstreamsOut and
// status.unhealthyUpstreams from the live replicas' reports: an upstream of the spec
// is unhealthy while a live replica reports its breaker not closed or its credential
// cooling, for rate pressure or billing. A fleet without a model registry tracks no
// health and shows none.
func setUpstreamHealth(st *twv1alpha1.TokenProxyStatus, tp *twv1alpha1.TokenProxy, rs *reports) {
	if !slices.ContainsFunc(tp.Spec.Models, func(m twv1alpha1.ModelSpec) bool { return len(m.Upstreams) > 0 }) {
		st.Upstreams, st.UpstreamsOut, st.UnhealthyUpstreams = "", "", nil
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
			countHealth(u, h, open)
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
	st.UpstreamsOut = upstreamsOut(st.UnhealthyUpstreams)
}

// upstreamsOut is status.upstreamsOut: each unhealthy upstream with its reason, the
// gravest first, then in the spec's order.
func upstreamsOut(us []twv1alpha1.UnhealthyUpstream) string {
	sorted := slices.Clone(us)
	slices.SortStableFunc(sorted, func(a, b twv1alpha1.UnhealthyUpstream) int { return gravity[b.Reason] - gravity[a.Reason] })
	out := make([]string, len(sorted))
	for i, u := range sorted {
		out[i] = u.Name + "=" + strings.ToLower(u.Reason)
	}
	return strings.Join(out, ",")
}

// countHealth adds one replica's report h of an unhealthy upstream to u: its counts,
// and the gravest reason with that cooldown's message and intervals.
func countHealth(u *twv1alpha1.UnhealthyUpstream, h reportedHealth, open bool) {
	reason := ""
	if open {
		u.OpenReplicas++
		reason = outBreaker
	}
	if h.Cooling {
		if h.Reason == "billing" {
			u.BillingReplicas++
		} else {
			u.CoolingReplicas++
		}
	}
	cooling := outRate
	if h.Reason == "billing" {
		cooling = outBilling
	}
	if h.Cooling && gravity[cooling] > gravity[reason] {
		reason = cooling
	}
	if gravity[reason] <= gravity[u.Reason] {
		return
	}
	u.Reason, u.Message, u.RequestedSeconds, u.AppliedSeconds = reason, "", 0, 0
	if reason != outBreaker {
		u.Message = truncate(h.Message, 512)
		u.RequestedSeconds, u.AppliedSeconds = int64(h.RequestedSeconds), int64(h.AppliedSeconds)
	}
}
