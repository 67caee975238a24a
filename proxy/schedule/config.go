// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package schedule

import "github.com/tokenwarden/tokenwarden/proxy/config"

// OptionsFor returns the options of the scheduler of an upstream with capacity c under
// the document's scheduling sc, its defaults in force; the clock and the Observer are
// the caller's.
func OptionsFor(c *config.Capacity, sc *config.Scheduling) Options {
	o := Options{
		MaxInFlightRequests: c.MaxInFlightRequests,
		MaxInFlightTokens:   c.MaxInFlightTokens,
		MaxQueueWait:        sc.MaxQueueWait(),
		MaxQueueLength:      sc.QueueLength(),
		MaxQueueBytes:       sc.QueueBytes(),
		Aging:               sc.Aging(),
		OutputWeight:        sc.OutputTokenWeight(),
	}
	for _, cl := range Classes {
		o.ClassMaxQueueWait[cl] = sc.Classes.Of(cl.String()).MaxQueueWait(sc)
		o.MinShare[cl] = sc.Classes.MinShare(cl.String())
	}
	if l := c.Learn; l != nil {
		o.Learn = &Learn{MinInFlightRequests: l.MinInFlightRequests, Decrease: l.Decrease,
			LatencyThreshold: l.LatencyThreshold(), Cooldown: l.Cooldown()}
	}
	return o
}
