// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package budget

// SharedRecorder is a Recorder that also watches how a shared store spreads its
// buckets: the releases of slot groups on a Redis Cluster, and the slices of hot
// shared budgets a replica leases. Implementations must be safe for concurrent use
// and cheap: they are called on the request path.
type SharedRecorder interface {
	// SlotGroupRelease records the release of the slot groups a reservation took
	// before a later group refused it (or failed): lost is true when the release call
	// failed, and the budget stays charged until it refills (high, never low).
	SlotGroupRelease(lost bool)
	// SliceLeased records a slice of a hot shared bucket taken from the store, by the
	// bucket's dimension and period.
	SliceLeased(d Dimension, period Kind)
	// SliceReturned records the unspent part of a slice sent back to the store (idle,
	// on a reload of the budget, or when the store closes).
	SliceReturned(d Dimension, period Kind)
	// SliceRefused records a slice the shared bucket could not give whole: the
	// request was decided in the store as without slices.
	SliceRefused(d Dimension, period Kind)
	// SliceHeld moves the tokens this replica holds unspent in slices by delta.
	SliceHeld(d Dimension, period Kind, delta float64)
}
