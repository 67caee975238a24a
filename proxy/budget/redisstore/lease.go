// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package redisstore

import (
	"context"
	"sync"
	"time"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
)

// Leased slices of hot shared budgets. A global or per-model token budget is drawn on
// by every request of the fleet: on a cluster its key is one slot, so every admission
// would go to one master, and on one server it is the key every script call touches.
// With Options.LeaseFraction above 0 a replica takes a slice of such a bucket from
// Redis, fraction × its capacity tokens in one reservation, and spends it locally:
// the requests it admits draw on the slice and the call to Redis leaves the bucket
// out. A slice is taken whole from the shared bucket, so the fleet never admits more
// than the bucket holds; what replicas hold unspent is at most one slice each (two
// after refunds come back, the rest goes to Redis), and the bucket lacks it until
// they return it: a slice idle for a second is returned, and so is every slice when
// the store closes. A replica that dies holding a slice loses it: the bucket counts
// it spent (high, never low) until it refills. A request the slice cannot cover
// takes a new slice; when the bucket cannot give a whole slice the request is
// decided in Redis as without leases, so the last tokens of a bucket are never held
// back from a request that fits.

// leaseIdle is how long a slice may sit unused before it goes back to Redis.
const leaseIdle = time.Second

// lease is one replica's slice of one shared bucket.
type lease struct {
	mu sync.Mutex
	// have is the tokens held; ch the bucket's parameters when the slice was taken.
	have float64
	ch   budget.Charge
	// level is the shared bucket's level after the last slice was taken.
	level float64
	used  time.Time
	// key is the bucket's; rec is told what the lease holds (observe.go).
	key budget.Key
	rec budget.SharedRecorder
}

// leasable tells whether a charge may be served from a slice: a token bucket of the
// global or a per-model budget, of limits, that refuses (not a warn rule) and is not
// durable.
func leasable(ch *budget.Charge) bool {
	return (ch.Key.Dim == budget.Global || ch.Key.Dim == budget.Model) &&
		(ch.Key.Kind == budget.TokensMinute || ch.Key.Kind == budget.TokensDay) &&
		ch.Key.Rule == "" && !ch.Warn && !ch.Durable && ch.SharedCapacity > 0
}

// leasedCharges are the charges of one reservation served from slices.
type leasedCharges struct {
	// idx index the reservation's Tokens; from the lease each drew on.
	idx  []int
	from []*lease
	amt  []float64
}

// takeLeases serves what it can of r's hot shared buckets from slices and returns the
// rest of the reservation for Redis.
func (s *Store) takeLeases(ctx context.Context, r *budget.Reservation) (*budget.Reservation, *leasedCharges) {
	var lc *leasedCharges
	for i := range r.Tokens {
		ch := &r.Tokens[i]
		if !leasable(ch) {
			continue
		}
		l := s.leaseOf(ch.Key)
		if !s.takeFrom(ctx, l, ch) {
			continue
		}
		if lc == nil {
			lc = &leasedCharges{}
		}
		lc.idx, lc.from, lc.amt = append(lc.idx, i), append(lc.from, l), append(lc.amt, ch.Amount)
	}
	if lc == nil {
		return r, nil
	}
	rest := &budget.Reservation{Requests: r.Requests, Tokens: make([]budget.Charge, 0, len(r.Tokens)-len(lc.idx))}
	j := 0
	for i := range r.Tokens {
		if j < len(lc.idx) && lc.idx[j] == i {
			j++
			continue
		}
		rest.Tokens = append(rest.Tokens, r.Tokens[i])
	}
	return rest, lc
}

func (s *Store) leaseOf(k budget.Key) *lease {
	if l, ok := s.leases.Load(k); ok {
		return l.(*lease)
	}
	l, _ := s.leases.LoadOrStore(k, &lease{key: k, rec: s.shared()})
	return l.(*lease)
}

// takeFrom takes ch's amount from the lease, taking a new slice from Redis when the
// lease holds too little; false when the bucket cannot give a whole slice (or Redis
// cannot be reached), and the request is decided in Redis.
func (s *Store) takeFrom(ctx context.Context, l *lease, ch *budget.Charge) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ch.SharedCapacity != ch.SharedCapacity || l.ch.SharedRate != ch.SharedRate {
		// The budget changed (a reload): what is held goes back under the old
		// parameters, and a slice is taken under the new.
		s.returnLocked(l)
	}
	if l.have < ch.Amount {
		slice := max(s.leaseFraction*ch.SharedCapacity, ch.Amount)
		take := *ch
		take.Amount = slice
		res, err := s.reserveShared(ctx, &budget.Reservation{Tokens: []budget.Charge{take}})
		if err != nil || !res.Admitted {
			if err == nil {
				l.rec.SliceRefused(ch.Key.Dim, ch.Key.Kind)
			}
			return false
		}
		l.add(slice)
		l.ch = *ch
		l.level = res.TokenLevels[0]
		s.leaseTakes.Add(1)
		l.rec.SliceLeased(ch.Key.Dim, ch.Key.Kind)
	}
	l.add(-ch.Amount)
	l.used = time.Now()
	return true
}

// giveBack returns a refused or failed reservation's leased amounts to their slices.
func (lc *leasedCharges) giveBack() {
	if lc == nil {
		return
	}
	for n, l := range lc.from {
		l.mu.Lock()
		l.add(lc.amt[n])
		l.mu.Unlock()
	}
}

// merge fits Redis' result for the rest of the reservation back into r's: the leased
// buckets report the shared level their last slice left plus what this replica
// holds.
func (lc *leasedCharges) merge(r *budget.Reservation, rest budget.Result) budget.Result {
	res := rest
	res.TokenLevels = make([]float64, len(r.Tokens))
	res.TokenSkipped = make([]bool, len(r.Tokens))
	if rest.TokenWarned != nil {
		res.TokenWarned = make([]bool, len(r.Tokens))
	}
	j, k := 0, 0
	for i := range r.Tokens {
		if j < len(lc.idx) && lc.idx[j] == i {
			l := lc.from[j]
			l.mu.Lock()
			res.TokenLevels[i] = l.level + l.have
			l.mu.Unlock()
			j++
			continue
		}
		if k < len(rest.TokenLevels) {
			res.TokenLevels[i] = rest.TokenLevels[k]
			res.TokenSkipped[i] = rest.TokenSkipped[k]
			if rest.TokenWarned != nil {
				res.TokenWarned[i] = rest.TokenWarned[k]
			}
		}
		k++
	}
	return res
}

// refundLeased returns the charges that draw on a slice to it (at most two slices are
// held; the rest goes to Redis) and gives back the others.
func (s *Store) refundLeased(charges []budget.Charge) []budget.Charge {
	var rest []budget.Charge
	for _, ch := range charges {
		if !leasable(&ch) {
			rest = append(rest, ch)
			continue
		}
		v, ok := s.leases.Load(ch.Key)
		if !ok {
			rest = append(rest, ch)
			continue
		}
		l := v.(*lease)
		l.mu.Lock()
		if l.ch.SharedCapacity == ch.SharedCapacity && l.ch.SharedRate == ch.SharedRate {
			room := 2*s.leaseFraction*ch.SharedCapacity - l.have
			keep := min(max(room, 0), ch.Amount)
			l.add(keep)
			ch.Amount -= keep
		}
		l.mu.Unlock()
		if ch.Amount > 0 {
			rest = append(rest, ch)
		}
	}
	return rest
}

// returnLocked sends what a lease holds back to Redis (l.mu held).
func (s *Store) returnLocked(l *lease) {
	if l.have > 0 && l.ch.SharedCapacity > 0 {
		ch := l.ch
		ch.Amount = l.have
		go func() { _ = s.refundShared([]budget.Charge{ch}) }()
		l.rec.SliceReturned(ch.Key.Dim, ch.Key.Kind)
	}
	l.add(-l.have)
}

// returnIdle returns the slices idle for leaseIdle, every leaseIdle, until the store
// closes; then it returns every slice.
func (s *Store) returnIdle() {
	defer s.workers.Done()
	t := time.NewTicker(leaseIdle / 2)
	defer t.Stop()
	for {
		select {
		case <-s.done:
			s.leases.Range(func(_, v any) bool {
				l := v.(*lease)
				l.mu.Lock()
				if l.have > 0 {
					ch := l.ch
					ch.Amount = l.have
					l.add(-l.have)
					l.rec.SliceReturned(ch.Key.Dim, ch.Key.Kind)
					_ = s.send(&queue{}, []call{{kind: refundCall, refunds: s.refundsOf([]budget.Charge{ch}), done: make(chan reply, 1)}})
				}
				l.mu.Unlock()
				return true
			})
			return
		case now := <-t.C:
			s.leases.Range(func(_, v any) bool {
				l := v.(*lease)
				l.mu.Lock()
				if l.have > 0 && now.Sub(l.used) >= leaseIdle {
					s.returnLocked(l)
				}
				l.mu.Unlock()
				return true
			})
		}
	}
}
