// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package budget

import (
	"context"
	"slices"
	"sync"
	"time"
)

// SlotAsk is one in-flight counter a request takes a slot of: a rule's in_flight
// window for one subject and count_by value, and its limit.
type SlotAsk struct {
	Key   Key
	Limit int64
	// Held is the counter's slots in flight as its store told: after a take (the
	// request's own among them, or at the limit for the ask refused), a peek or an
	// end; -1 when the store did not tell.
	Held int64
	// ctr is the rule window the ask is of.
	ctr *counter
}

// Slots keeps the in-flight counters of rules: this replica's memory, or a store
// every replica shares (proxy/agentlimit/redisagents), where a slot is leased so
// that a replica's crash frees its slots.
type Slots interface {
	// TakeSlots takes one slot of every ask, all or nothing, and returns the hold;
	// refused is the index of an ask at its limit (-1: taken). It sets the Held of
	// every ask taken, or of the one refused. An error means the store could not
	// decide (this replica's own counts decide then); nothing is held.
	TakeSlots(ctx context.Context, asks []SlotAsk) (hold SlotHold, refused int, err error)
	// Shared reports whether the counts are the fleet's.
	Shared() bool
}

// SlotPeeker is a Slots that counts each ask's slots in flight (Held) and takes
// nothing.
type SlotPeeker interface {
	PeekSlots(ctx context.Context, asks []SlotAsk) error
}

// SlotHold is the slots an admitted request holds.
type SlotHold interface {
	// End gives them back, once, and returns the asks they were taken for with
	// Held after the end; nil when they had been given back.
	End() []SlotAsk
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
// replica's memory while it cannot decide. It returns the refusing ask's index, or -1,
// and publishes the windows' decisions and counts.
func (l *Limiter) takeSlots(ctx context.Context, c *charges) (SlotHold, int, bool) {
	h, refused, alone := l.takeSlotsFrom(ctx, c.slots)
	if refused >= 0 {
		l.stats(c.slots[refused].ctr).Decision(RuleRefused)
		l.recordSlot(&c.slots[refused])
		return h, refused, alone
	}
	for i := range c.slots {
		l.stats(c.slots[i].ctr).Decision(RuleAdmitted)
		l.recordSlot(&c.slots[i])
	}
	return h, refused, alone
}

// takeSlotsFrom takes the asks' slots in the shared store, or in memory while it
// cannot decide (alone).
func (l *Limiter) takeSlotsFrom(ctx context.Context, asks []SlotAsk) (SlotHold, int, bool) {
	if l.slots != nil {
		h, refused, err := l.slots.TakeSlots(ctx, asks)
		if err == nil {
			return h, refused, false
		}
	}
	h, refused, _ := l.memSlots.TakeSlots(ctx, asks)
	return h, refused, l.slots != nil
}

// endSlots gives a request's slots back and publishes its windows' counts after.
func (l *Limiter) endSlots(h SlotHold) {
	asks := h.End()
	for i := range asks {
		l.recordSlot(&asks[i])
	}
}

// recordSlot publishes an in-flight window's share of its limit in flight, as its
// store told it.
func (l *Limiter) recordSlot(a *SlotAsk) {
	if a.Held < 0 || a.Limit <= 0 || a.Key.Rule == "" {
		return
	}
	l.stats(a.ctr).Level(float64(a.Held)/float64(a.Limit), float64(a.Limit), AmountInFlight, time.Time{})
}

// peekSlots counts the asks' slots in flight as an admission now would: in the
// shared store, or in memory while it cannot tell (why says why). fleet reports
// whether the counts are the fleet's.
func (l *Limiter) peekSlots(ctx context.Context, asks []SlotAsk) (fleet bool, why string) {
	if l.slots != nil {
		sp, ok := l.slots.(SlotPeeker)
		if !ok {
			why = "the store of slots in flight does not tell them"
		} else if err := sp.PeekSlots(ctx, asks); err != nil {
			why = err.Error()
		} else {
			return l.slots.Shared(), ""
		}
	}
	_ = l.memSlots.PeekSlots(ctx, asks)
	return false, why
}

// inFlightRefusal is the refusal of a request by the in-flight window of ch.
func inFlightRefusal(ch *SlotAsk) *Refusal {
	return &Refusal{
		Dimension: ch.Key.Dim, Period: InFlight, Rule: ch.Key.Rule, Window: "in_flight", Amount: AmountInFlight,
		Scoped: ch.ctr.scoped, WindowIndex: ch.Key.Window, RetryAfter: retryInFlight, Asked: 1,
		Bucket: Status{Present: ch.ctr.scoped, Limit: ch.Limit},
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
		if n := m.n[asks[i].Key]; n >= asks[i].Limit {
			asks[i].Held = n
			return nil, i, nil
		}
	}
	for i := range asks {
		m.n[asks[i].Key]++
		asks[i].Held = m.n[asks[i].Key]
	}
	return &memoryHold{m: m, asks: slices.Clone(asks)}, -1, nil
}

// PeekSlots implements SlotPeeker in memory.
func (m *memorySlots) PeekSlots(_ context.Context, asks []SlotAsk) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	for i := range asks {
		asks[i].Held = m.n[asks[i].Key]
	}
	return nil
}

// Shared implements Slots: memory is this replica's own.
func (m *memorySlots) Shared() bool { return false }

type memoryHold struct {
	m    *memorySlots
	asks []SlotAsk
	once sync.Once
}

// End implements SlotHold.
func (h *memoryHold) End() []SlotAsk {
	var out []SlotAsk
	h.once.Do(func() {
		h.m.mu.Lock()
		defer h.m.mu.Unlock()
		for i := range h.asks {
			k := h.asks[i].Key
			if h.m.n[k]--; h.m.n[k] <= 0 {
				delete(h.m.n, k)
			}
			h.asks[i].Held = h.m.n[k]
		}
		out = h.asks
	})
	return out
}
