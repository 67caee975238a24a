// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package redisstore

import (
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
)

// The batch. Reservations waiting together mostly draw on the same buckets (the
// global, model and team buckets always, a busy key's own ones), and mostly fit. So
// an apply call carries, beside each reservation's spec, their sum by bucket: each
// bucket once, with what all of them take from it. When every bucket holds its sum
// (with a margin far above the rounding of adding the amounts one by one), deciding
// them one by one would admit every one, each taking its amounts: the script then
// refills and takes each bucket once, and returns each bucket's level before, from
// which the store derives every reservation's decision and levels, subtracting in
// arrival order as the script would have. Otherwise (a bucket short, an untrusted
// epoch) the script decides them one by one as before, and nothing the sum path read
// was written. The stored level is the level before minus the sum, which differs
// from subtracting one by one by at most a rounding of the last bit.
//
// A call offers the sum only when it means the same as one by one: each bucket of the
// batch recorded with the same parameters by every reservation, no bucket twice in
// one reservation, and no amount above its bucket's capacity or below zero.

// batchSum is the sum by bucket of the reservations of one apply call.
type batchSum struct {
	// buckets are the distinct buckets, in the order first seen.
	buckets []sumBucket
	// at is a bucket's index in buckets plus one, at 4 × its key index + its slot.
	at []int
	// idx is, for each bucket of each reservation in order, its index in buckets.
	idx []int
	// seen is the reservation that last took each of buckets, plus one.
	seen []int
	// off means the sum cannot stand for the reservations.
	off bool
	// reservations counts the reservations added.
	reservations int
	// layout is the reused layout b belongs to, if any (reuse.go).
	layout *applyLayout
}

// sumBucket is one bucket of a batch: its decide-spec fields, and the sum taken.
type sumBucket struct {
	k                       uint16
	slot, flags             byte
	capacity, rate, wait, a float64
}

// startReservation begins the next reservation's buckets.
func (b *batchSum) startReservation() { b.reservations++ }

// add adds one bucket of the current reservation.
func (b *batchSum) add(k uint16, slot, flags byte, capacity, rate, wait, amount float64) {
	if b.off {
		return
	}
	if amount > capacity || !(amount >= 0) {
		b.off = true
		return
	}
	id := 4*int(k) + int(slot)
	if id >= len(b.at) {
		b.at = append(b.at, make([]int, id+1-len(b.at)+4*16)...)
	}
	i := b.at[id]
	if i == 0 {
		b.buckets = append(b.buckets, sumBucket{k: k, slot: slot, flags: flags, capacity: capacity, rate: rate, wait: wait})
		b.seen = append(b.seen, 0)
		i = len(b.buckets)
		b.at[id] = i
	}
	i--
	sb := &b.buckets[i]
	if b.seen[i] == b.reservations || sb.flags != flags || sb.capacity != capacity || sb.rate != rate || sb.wait != wait {
		b.off = true
		return
	}
	b.seen[i] = b.reservations
	sb.a += amount
	b.idx = append(b.idx, i)
}

// spec is the sum's argument, appended to buf: one bucket of the decide spec layout
// per distinct bucket, with the sum as its amount; empty when the sum cannot stand
// for the reservations.
func (b *batchSum) spec(buf []byte) []byte {
	if b.off || len(b.buckets) == 0 {
		return buf
	}
	buf = slices.Grow(buf, len(b.buckets)*decideSpecSize)
	for _, sb := range b.buckets {
		buf = binary.LittleEndian.AppendUint16(buf, sb.k)
		buf = append(buf, sb.slot, sb.flags)
		for _, v := range [4]float64{sb.capacity, sb.rate, sb.wait, sb.a} {
			buf = binary.LittleEndian.AppendUint64(buf, math.Float64bits(v))
		}
	}
	return buf
}

// terms is the reservations in the sum's terms, appended to buf: for each, its
// request-count buckets and its buckets (two uint16), then per bucket its index in
// the sum, 1-based (uint16), and its amount (float64), all little-endian. Only for a
// sum that stands for the reservations.
func (b *batchSum) terms(buf []byte, reserves []*budget.Reservation) []byte {
	buf = slices.Grow(buf, 4*len(reserves)+10*len(b.idx))
	pos := 0
	for _, r := range reserves {
		n := len(r.Requests) + len(r.Tokens)
		buf = binary.LittleEndian.AppendUint16(buf, uint16(len(r.Requests)))
		buf = binary.LittleEndian.AppendUint16(buf, uint16(n))
		for i := range n {
			amount := 1.0
			if i >= len(r.Requests) {
				amount = r.Tokens[i-len(r.Requests)].Amount
			}
			buf = binary.LittleEndian.AppendUint16(buf, uint16(b.idx[pos+i]+1))
			buf = binary.LittleEndian.AppendUint64(buf, math.Float64bits(amount))
		}
		pos += n
	}
	return buf
}

// sumDecision is a reservation admitted on the sum path: its buckets' levels after it
// took its amounts (requests first), and Redis' clock in milliseconds.
type sumDecision struct {
	levels []float64
	// skipped is all false (Redis skips no bucket), as long as levels.
	skipped []bool
	now     int64
}

// decisions turns the script's reply to a call into one decision per reservation. A
// reply of the sum path is the level before of each distinct bucket and Redis' clock:
// each reservation gets a *sumDecision. The decisions of one by one come as they are.
func (b *batchSum) decisions(reply []any, reserves []*budget.Reservation) ([]any, error) {
	if len(reply) != 2 {
		return reply, nil
	}
	packed, ok := reply[0].(string)
	if !ok {
		return reply, nil // two decisions, one by one
	}
	now, _ := reply[1].(int64)
	if b == nil || b.off || len(packed) != 8*len(b.buckets) {
		return nil, fmt.Errorf("redis apply script: %d bytes of levels for %d buckets", len(packed), len(b.buckets))
	}
	level := make([]float64, len(b.buckets))
	for i := range level {
		level[i] = math.Float64frombits(binary.LittleEndian.Uint64([]byte(packed[8*i : 8*i+8])))
	}
	// Every reservation's levels, one after the other, in one slice.
	all := make([]float64, len(b.idx))
	none := make([]bool, len(b.idx))
	out := make([]any, len(reserves))
	// One slice of decisions: each reply points into it, boxing no value.
	decided := make([]sumDecision, len(reserves))
	pos := 0
	for j, r := range reserves {
		n := len(r.Requests) + len(r.Tokens)
		for i := range n {
			amount := 1.0
			if i >= len(r.Requests) {
				amount = r.Tokens[i-len(r.Requests)].Amount
			}
			d := b.idx[pos+i]
			level[d] -= amount
			all[pos+i] = level[d]
		}
		decided[j] = sumDecision{levels: all[pos : pos+n : pos+n], skipped: none[pos : pos+n : pos+n], now: now}
		out[j] = &decided[j]
		pos += n
	}
	return out, nil
}

// admittedBySum is the result of reservation r admitted on the sum path in slot group
// g: what parseReserve makes of an admission decided alone.
func (s *Store) admittedBySum(d *sumDecision, r *budget.Reservation, g int) budget.Result {
	s.offset.Store(d.now*int64(time.Millisecond) - time.Now().UnixNano())
	if g := s.groups[g]; g.fence.Load() != nil && fenceable(r) {
		// A durable reservation decided found the epoch again.
		if g.trust() {
			s.epochChanged()
		}
	}
	nreq := len(r.Requests)
	return budget.Result{
		Admitted:       true,
		Backend:        s,
		Shared:         true,
		RequestLevels:  d.levels[:nreq:nreq],
		TokenLevels:    d.levels[nreq:],
		RequestSkipped: d.skipped[:nreq:nreq],
		TokenSkipped:   d.skipped[nreq:],
	}
}
