// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package redisstore

import "time"

// AdjustScript lets tests load one script without the other.
var ChargeScript = chargeScript

// ShiftCalendar moves the present the store tells calendar windows by, so a test can
// stand in any month (a daylight-saving change, a short February).
func (s *Store) ShiftCalendar(d time.Duration) { s.shift.Store(int64(d)) }

// Waiting is the number of calls waiting for a pipeline worker or for their
// pipeline's replies.
func (s *Store) Waiting() int { return s.waiting() }

// BeforeRelease runs f before each release of slot groups is sent.
func (s *Store) BeforeRelease(f func()) { s.beforeRelease = f }

// BeforeReplay runs f before each call that charges Redis with the ledger
// fallback's spend.
func (s *Store) BeforeReplay(f func()) { s.beforeReplay = f }
