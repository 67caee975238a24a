// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package budget

import (
	"context"
	"sync"
	"time"
)

// SlotAsk is one in-flight counter a request takes a slot of: a rule's in_flight
// window for one subject and count_by value, and its limit.
type SlotAsk struct {
	Key   Key
	Limit int64
}

// Slots keeps the in-flight counters of rules: this replica's memory, or a store
// every replica shares (proxy/agentlimit/redisagents), where a slot is leased so
// that a replica's crash frees its slots.
type Slots interface {
	// TakeSlots takes one slot of every ask, all or nothing, and returns the hold;
	// refused is the index of an ask at its limit (-1: taken). An error means the
	// store could not decide (this replica's own counts decide then); nothing is held.
	TakeSlots(ctx context.Context, asks []SlotAsk) (hold SlotHold, refused int, err error)
	// Shared reports whether the counts are the fleet's.
	Shared() bool
}

// SlotHold is the slots an admitted request holds; End gives them back, once.
type SlotHold interface {
	End()
}

// SetSlots makes s keep the limiter's in-flight counters; nil keeps them in this
// replica's memory. Called before the limiter admits.
func (l *Limiter) SetSlots(s Slots) { l.slots = s }

// SlotsShared reports whether the in-flight counters are the fleet's totals.
func (l *Limiter) SlotsShared() bool { return l.slots != nil && l.slots.Shared() }

// retryInFlight is the Retry-After of a refusal by an in-flight limit: a slot is given
// back when a request ends, which no clock tells.
const retryInFlight = time.Second

// takeSlots takes the slots of c's in-flight asks: in the shared store, or in this
// replica's memory while it cannot decide. It returns the refusing ask's index, or -1.
func (l *Limiter) takeSlots(ctx context.Context, c *charges) (SlotHold, int, bool) {
	if l.slots != nil {
		h, refused, err := l.slots.TakeSlots(ctx, c.slots)
		if err == nil {
			return h, refused, false
		}
	}
	h, refused, _ := l.memSlots.TakeSlots(ctx, c.slots)
	return h, refused, l.slots != nil
}

// inFlightRefusal is the refusal of a request by the in-flight window of ch.
func inFlightRefusal(ch *SlotAsk, scoped bool) *Refusal {
	return &Refusal{
		Dimension: ch.Key.Dim, Period: InFlight, Rule: ch.Key.Rule, Window: "in_flight", Amount: AmountInFlight,
		Scoped: scoped, WindowIndex: ch.Key.Window, RetryAfter: retryInFlight, Asked: 1,
		Bucket: Status{Present: scoped, Limit: ch.Limit},
	}
}

// memorySlots are in-flight counters in this replica's memory: a count per counter,
// dropped when it is back to 0, so the map holds only what is in flight.
type memorySlots struct {
	mu sync.Mutex
	n  map[Key]int64
}

// TakeSlots implements Slots in memory.
func (m *memorySlots) TakeSlots(_ context.Context, asks []SlotAsk) (SlotHold, int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.n == nil {
		m.n = map[Key]int64{}
	}
	for i := range asks {
		if m.n[asks[i].Key] >= asks[i].Limit {
			return nil, i, nil
		}
	}
	h := &memoryHold{m: m, keys: make([]Key, len(asks))}
	for i := range asks {
		m.n[asks[i].Key]++
		h.keys[i] = asks[i].Key
	}
	return h, -1, nil
}

// Shared implements Slots: memory is this replica's own.
func (m *memorySlots) Shared() bool { return false }

type memoryHold struct {
	m    *memorySlots
	keys []Key
	once sync.Once
}

// End implements SlotHold.
func (h *memoryHold) End() {
	h.once.Do(func() {
		h.m.mu.Lock()
		defer h.m.mu.Unlock()
		for _, k := range h.keys {
			if h.m.n[k]--; h.m.n[k] <= 0 {
				delete(h.m.n, k)
			}
		}
	})
}
