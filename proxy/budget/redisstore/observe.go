// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package redisstore

import "github.com/tokenwarden/tokenwarden/proxy/budget"

// What the store tells a budget.SharedRecorder: the releases of slot groups after a
// refusal on a cluster (sent, or lost: the budget stays charged), and the slices of hot
// shared budgets (leased, returned, refused because the bucket could not give a whole
// slice, and the tokens this replica holds unspent).

// shared is the store's recorder of releases and slices; a no-op when the Recorder
// does not watch them.
func (s *Store) shared() budget.SharedRecorder {
	if sr, ok := s.rec.(budget.SharedRecorder); ok {
		return sr
	}
	return nopShared{}
}

type nopShared struct{}

func (nopShared) SlotGroupRelease(bool)                            {}
func (nopShared) SliceLeased(budget.Dimension, budget.Kind)        {}
func (nopShared) SliceReturned(budget.Dimension, budget.Kind)      {}
func (nopShared) SliceRefused(budget.Dimension, budget.Kind)       {}
func (nopShared) SliceHeld(budget.Dimension, budget.Kind, float64) {}

// add moves what the lease holds by delta and tells the recorder (l.mu held).
func (l *lease) add(delta float64) {
	if delta == 0 {
		return
	}
	l.have += delta
	l.rec.SliceHeld(l.key.Dim, l.key.Kind, delta)
}
