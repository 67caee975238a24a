// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package controllers

import (
	"testing"

	twv1alpha1 "github.com/tokenwarden/tokenwarden/api/v1alpha1"
)

func TestAgentPlacementSaysWhereTheLimitsForAgentsHold(t *testing.T) {
	k := &twv1alpha1.ApiKey{Spec: twv1alpha1.ApiKeySpec{MaxInFlight: 2, RunMaxSteps: 50}}
	for _, c := range []struct {
		redis bool
		want  string
	}{
		{true, "; maxInFlight, runMaxSteps: the fleet's totals (Redis storage)"},
		{false, "; maxInFlight, runMaxSteps: each replica's own, not divided (memory storage): a fleet of N replicas may let the key N times each"},
	} {
		if got := agentPlacement(k, c.redis); got != c.want {
			t.Errorf("redis %v: %q, want %q", c.redis, got, c.want)
		}
	}
	if got := agentPlacement(&twv1alpha1.ApiKey{}, false); got != "" {
		t.Errorf("a key without limits for agents: %q", got)
	}
}
