// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package controllers

import (
	"strings"

	twv1alpha1 "github.com/tokenwarden/tokenwarden/api/v1alpha1"
	"github.com/tokenwarden/tokenwarden/controllers/render"
)

// budgetPlacement is what a budget's Ready message says of where it is enforced:
// placement for a budget of windows over time; for an InFlight budget, the fleet's
// total in leased slots under Redis storage, or each replica's own limit, whole,
// under memory storage (dividing 2 in flight among 3 replicas would leave each none).
func budgetPlacement(b *twv1alpha1.TokenBudget, placement string, redis bool) string {
	if render.AmountOf(b) != twv1alpha1.AmountInFlight {
		return placement
	}
	if redis {
		// The lease is the proxy's redisagents.DefaultLease.
		return "Redis storage: the replicas share the fleet's total in flight, in leased slots (a replica that dies frees its slots within 30s)"
	}
	return "memory storage: each replica's own limit in flight, whole, not divided: a fleet of N replicas may let N times as many requests in flight"
}

// agentPlacement is what an ApiKey's Ready message says of its limits for agents: the
// fleet's totals under Redis storage, each replica's own under memory storage (not
// divided: a limit of 2 in flight over 3 replicas would leave each none); "" when the
// key sets none.
func agentPlacement(k *twv1alpha1.ApiKey, redis bool) string {
	var set []string
	if k.Spec.MaxInFlight > 0 {
		set = append(set, "maxInFlight")
	}
	if k.Spec.RunTokenBudget > 0 {
		set = append(set, "runTokenBudget")
	}
	if k.Spec.RunMaxSteps > 0 {
		set = append(set, "runMaxSteps")
	}
	if len(set) == 0 {
		return ""
	}
	names := strings.Join(set, ", ")
	if redis {
		return "; " + names + ": the fleet's totals (Redis storage)"
	}
	return "; " + names + ": each replica's own, not divided (memory storage): a fleet of N replicas may let the key N times each"
}
