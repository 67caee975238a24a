// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package render

import (
	"strings"

	twv1alpha1 "github.com/tokenwarden/tokenwarden/api/v1alpha1"
	"github.com/tokenwarden/tokenwarden/proxy/config"
)

// renderCapacity is an upstream's capacity in the proxy config (nil: none).
func renderCapacity(c *twv1alpha1.UpstreamCapacity) *config.Capacity {
	if c == nil || c.MaxInFlightRequests == 0 && c.MaxInFlightTokens == 0 {
		return nil
	}
	return &config.Capacity{MaxInFlightRequests: c.MaxInFlightRequests, MaxInFlightTokens: c.MaxInFlightTokens}
}

// renderScheduling writes a fleet's scheduling into the proxy config; an absent one
// leaves the document as it was without it.
func renderScheduling(s *twv1alpha1.SchedulingSpec, c *config.Config) {
	if s == nil {
		return
	}
	sc := &c.Scheduling
	sc.MaxQueueWaitSeconds = s.MaxQueueWaitSeconds
	sc.MaxQueueLength = s.MaxQueueLength
	sc.MaxQueueBytes = s.MaxQueueBytes
	sc.AgingSeconds = s.AgingSeconds
	if s.OutputWeight != nil {
		sc.OutputWeight = quantityFloat(*s.OutputWeight)
	}
	sc.Classes.Interactive = renderClass(s.Interactive)
	sc.Classes.Batch = renderClass(s.Batch)
	sc.Classes.Background = renderClass(s.Background)
	c.Agents = config.Agents{MaxRuns: s.MaxRuns, RunIdleSeconds: s.RunIdleSeconds}
}

func renderClass(cs *twv1alpha1.ClassSpec) config.ClassLimits {
	if cs == nil {
		return config.ClassLimits{}
	}
	return config.ClassLimits{
		MaxQueueWaitSeconds: cs.MaxQueueWaitSeconds,
		MinSharePercent:     cs.MinSharePercent,
		MaxOutputTokens:     cs.MaxOutputTokens,
		OverMaxOutputTokens: config.OverAction(strings.ToLower(string(cs.OverMaxOutputTokens))),
	}
}

// renderKeyScheduling writes an ApiKey's class, weight and limits for agents into its
// entry of the proxy config.
func renderKeyScheduling(s *twv1alpha1.ApiKeySpec, k *config.APIKey) {
	k.Priority = strings.ToLower(string(s.Priority))
	k.Weight = float64(s.Weight)
	k.MaxInFlight = s.MaxInFlight
	k.RunTokenBudget = s.RunTokenBudget
	k.RunMaxSteps = s.RunMaxSteps
}

// DrainConfig is what of a fleet's config sizes its pods' drain: the upstreams'
// timeouts and capacities and the scheduling's longest wait.
func DrainConfig(tp *twv1alpha1.TokenProxy) *config.Config {
	c := &config.Config{}
	for _, u := range tp.Spec.Upstreams {
		c.Upstreams = append(c.Upstreams, config.Upstream{TimeoutSeconds: u.TimeoutSeconds, Capacity: renderCapacity(u.Capacity)})
	}
	renderScheduling(tp.Spec.Scheduling, c)
	return c
}
