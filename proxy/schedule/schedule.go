// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

// Package schedule orders admitted requests in front of an upstream that can run only
// so much at once. A Scheduler holds the upstream's capacity (in-flight requests and
// in-flight reserved tokens): below it a request is dispatched at once, without
// waiting; at it, requests wait and are dispatched as capacity frees, by priority
// class first (interactive, batch, background), except that a class kept waiting goes
// first once the others have taken more than their share of what was dispatched in
// its stead (its minimum share), so that a lower class is never starved; and within a
// class by token-fair queueing after the Virtual Token
// Counter (Sheng et al., OSDI 2024): the tenant with the least weighted service so far
// goes first, service counted in tokens with output weighted above input.
//
// A wait is bounded: by its class's maximum wait, by the queue's length and the bytes
// its requests hold, and by the request's context (a client that goes away leaves the queue at once). Every
// dispatched request holds a Slot until Done, which gives its capacity back.
package schedule

import (
	"container/heap"
	"container/list"
	"context"
	"errors"
	"math"
	"sync"
	"time"
)

// Class is a priority class; a lower value is served first.
type Class uint8

// Priority classes.
const (
	Interactive Class = iota
	Batch
	Background
	numClasses
)

// Classes lists the classes in order of service.
var Classes = [...]Class{Interactive, Batch, Background}

// String returns the class's config word.
func (c Class) String() string {
	switch c {
	case Interactive:
		return "interactive"
	case Batch:
		return "batch"
	case Background:
		return "background"
	}
	return "unknown"
}

// ParseClass reads a class's config word; ok is false for any other word.
func ParseClass(s string) (Class, bool) {
	switch s {
	case "interactive":
		return Interactive, true
	case "batch":
		return Batch, true
	case "background":
		return Background, true
	}
	return 0, false
}

// Lower returns the class a request runs in when its key's class is key and the
// request asks for asked: a request may lower its priority, never raise it.
func Lower(key, asked Class) Class {
	if asked > key && asked < numClasses {
		return asked
	}
	return key
}

// Options configure a Scheduler.
type Options struct {
	// MaxInFlightRequests bounds the requests dispatched and not yet done (0: no bound).
	MaxInFlightRequests int64
	// MaxInFlightTokens bounds the tokens those requests reserved, input plus output
	// (0: no bound). A single request larger than the bound runs alone.
	MaxInFlightTokens int64
	// MaxQueueWait bounds a wait; a request still queued then gets ErrQueueTimeout.
	MaxQueueWait time.Duration
	// ClassMaxQueueWait bounds the wait of each class, by Class; a zero entry is
	// MaxQueueWait.
	ClassMaxQueueWait [len(Classes)]time.Duration
	// MaxQueueLength bounds the waiting requests; one more gets ErrQueueFull.
	MaxQueueLength int
	// MaxQueueBytes bounds the bodies the waiting requests hold (Request.Bytes); a
	// request that would take them past it gets ErrQueueFull, unless nothing waits (0:
	// no bound).
	MaxQueueBytes int64
	// MinShare is, by Class, the share (0 to 1, below 1) of the tokens dispatched
	// from the queue while the class waits that go to the class, however much
	// higher work waits, so that a lower class is never starved (0: none). Each
	// dispatch of another class while it waits credits it share of that request's
	// tokens; once its credit covers 1-share of its next request's, it goes first and
	// pays that. A dispatch of the class in its usual turn pays too, so a class served
	// anyway is never owed, and a class that stops waiting keeps no credit.
	MinShare [len(Classes)]float64
	// Aging raises a waiting class by one class for every Aging its oldest request has
	// waited (0: none). Under a lasting backlog a lower class's oldest request is
	// always that old, so aging shorter than the lower class's longest wait lets the
	// backlog go ahead of the classes above it.
	Aging time.Duration
	// OutputWeight is what an output token counts in the fair-queueing service,
	// against 1 for an input token (0: 1).
	OutputWeight float64
	// Now is the clock (default time.Now).
	Now func() time.Time
	// After starts the timer of a wait's deadline on the same clock as Now, and
	// returns its channel and a function that stops it (default a time.Timer).
	After func(d time.Duration) (<-chan time.Time, func() bool)
	// Observer, when set, is told of waits, dispatches and refusals.
	Observer Observer
	// Learn, when set with MaxInFlightRequests, learns the in-flight request bound
	// from the upstream's answers (learn.go).
	Learn *Learn
}

// TimerClock is a clock that also starts timers, as Options.After does: a scaled or
// simulated clock, on which a scheduler's deadlines then run too.
type TimerClock interface {
	Now() time.Time
	After(d time.Duration) (<-chan time.Time, func() bool)
}

// Observer is told what the scheduler does, for metrics. Its methods are called with
// the scheduler's lock held: they must be quick and must not call the scheduler.
type Observer interface {
	// Queued reports the class's queue length after a change.
	Queued(c Class, length int)
	// Dispatched reports a request leaving the queue for the upstream after wait.
	Dispatched(c Class, wait time.Duration)
	// Left reports a request leaving the queue without running, for reason
	// "queue_timeout", "queue_full" or "canceled".
	Left(c Class, reason string, wait time.Duration)
}

// Starter is an Observer that is also told of each request that starts without
// waiting, so that a wait histogram counts every request (those at 0).
type Starter interface {
	// Started reports a request of class c that started at once.
	Started(c Class)
}

// Request is what the scheduler knows of one request.
type Request struct {
	// Tenant is whose service the request counts as (the API key's name).
	Tenant string
	// Weight is the tenant's share against others of its class (0: 1).
	Weight float64
	Class  Class
	// Input and Output are the tokens the request reserved.
	Input, Output int64
	// Bytes is the memory the request holds while it waits (its body).
	Bytes int64
}

// Errors a wait ends with. A canceled context ends it with the context's error.
var (
	ErrQueueFull    = errors.New("the upstream's queue is full")
	ErrQueueTimeout = errors.New("the request waited in the upstream's queue for the longest wait allowed")
)

// WaitError is a wait refused or ended without dispatch; RetryAfter is when the queue
// should have room again, from its recent drain rate.
type WaitError struct {
	Err        error
	RetryAfter time.Duration
}

func (e *WaitError) Error() string { return e.Err.Error() }
func (e *WaitError) Unwrap() error { return e.Err }

// Scheduler is one upstream's admission control. It is safe for concurrent use.
type Scheduler struct {
	o  Options
	mu sync.Mutex
	// inReq and inTok are what is dispatched and not done.
	inReq, inTok int64
	// credit is each waiting class's due, in tokens, towards its minimum share.
	credit  [numClasses]float64
	classes [numClasses]classQueue
	waiting int
	// waitingBytes is the sum of the waiting requests' Bytes.
	waitingBytes int64
	// tenants keeps each tenant's service counter; a tenant is kept while it has
	// service recorded, bounded by the config's keys (and anonymous).
	tenants map[string]*tenant
	// interval is a moving average of the time between dispatches from the queue
	// while requests wait, in seconds: the queue's drain rate, for Retry-After.
	interval     float64
	lastDispatch time.Time
	// starter is the Observer's Starter side, if it has one.
	starter Starter
	// busySince is when the queue last went from empty to waiting, so that time with
	// nothing waiting never counts as time between dispatches.
	busySince time.Time
	seq       uint64
	// learned is the learned in-flight request bound (0: not learning), lastDecrease
	// when it last fell.
	learned      float64
	lastDecrease time.Time
}

type classQueue struct {
	// arrivals holds the class's waiters oldest first, for aging.
	arrivals list.List
	// tenants are the tenants with a waiter in this class, least service first
	// (fair.go).
	tenants tenantHeap
}

type tenant struct {
	// service is the weighted tokens served so far (the Virtual Token Counter).
	// Whoever changes it calls serviceChangedLocked.
	service float64
	// queues are the tenant's waiters in each class, nil where it has none.
	queues [numClasses]*tenantQueue
}

type waiter struct {
	req     Request
	cost    int64
	t       *tenant
	since   time.Time
	seq     uint64
	charged float64   // service counted at dispatch
	at      time.Time // when dispatched
	ready   chan struct{}
	arrival *list.Element
	own     *list.Element
	done    bool // dispatched
	// claim, when set, is shared by the copies of one request waiting in several
	// schedulers' queues (any.go): only the copy that claims it is dispatched.
	claim *claim
}

// New returns a Scheduler.
func New(o Options) *Scheduler {
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.After == nil {
		o.After = wallTimer
	}
	if o.OutputWeight <= 0 {
		o.OutputWeight = 1
	}
	s := &Scheduler{o: o, tenants: make(map[string]*tenant)}
	s.starter, _ = o.Observer.(Starter)
	s.clampLearned()
	return s
}

// wallTimer is After's default: a time.Timer.
func wallTimer(d time.Duration) (<-chan time.Time, func() bool) {
	t := time.NewTimer(d)
	return t.C, t.Stop
}

// Configure changes the scheduler's bounds and order (every option but Now, After and
// Observer) keeping what is in flight, what waits, and the tenants' service; waiters
// that fit the new bounds are dispatched at once. A wait already begun keeps the
// longest wait it started with.
func (s *Scheduler) Configure(o Options) {
	s.mu.Lock()
	defer s.mu.Unlock()
	o.Now, o.After, o.Observer = s.o.Now, s.o.After, s.o.Observer
	if o.OutputWeight <= 0 {
		o.OutputWeight = 1
	}
	s.o = o
	s.clampLearned()
	s.dispatchLocked()
}

// Slot is a dispatched request's hold on the upstream's capacity. Its zero value holds
// nothing. Done gives the capacity back; it is safe to call more than once.
type Slot struct {
	s      *Scheduler
	t      *tenant
	cost   int64
	weight float64
	// charged is the service counted when the request started.
	charged float64
	// at is when the request was dispatched; answered is set once Answered counted.
	at       time.Time
	answered bool
}

// Held reports whether the slot holds capacity.
func (sl *Slot) Held() bool { return sl.s != nil }

// Done gives the slot's capacity back and corrects the tenant's service to the tokens
// the request used (input and output as reported; a request that ran without usage
// passes what it reserved). A second call does nothing.
func (sl *Slot) Done(input, output int64) {
	s := sl.s
	if s == nil {
		return
	}
	sl.s = nil
	s.mu.Lock()
	s.releaseLocked(sl.cost)
	used := (float64(input) + s.o.OutputWeight*float64(output)) / sl.weight
	sl.t.service = math.Max(0, sl.t.service-sl.charged+used)
	s.serviceChangedLocked(sl.t)
	s.dispatchLocked()
	s.mu.Unlock()
}

// Acquire waits until the request may run and returns its slot. Below capacity with
// no queue it returns at once. It returns a *WaitError wrapping ErrQueueFull or
// ErrQueueTimeout, or the context's error when ctx ends first; either way the request
// holds nothing.
func (s *Scheduler) Acquire(ctx context.Context, r Request) (Slot, error) {
	if r.Weight <= 0 {
		r.Weight = 1
	}
	if r.Class >= numClasses {
		r.Class = Background
	}
	cost := r.Input + r.Output
	s.mu.Lock()
	t := s.tenant(r.Tenant)
	if s.waiting == 0 && s.fits(cost) {
		return s.startNowLocked(t, &r, cost), nil
	}
	now := s.o.Now()
	if s.o.MaxQueueLength > 0 && s.waiting >= s.o.MaxQueueLength ||
		s.o.MaxQueueBytes > 0 && s.waiting > 0 && s.waitingBytes+r.Bytes > s.o.MaxQueueBytes {
		err := &WaitError{Err: ErrQueueFull, RetryAfter: s.retryAfterLocked(r.Class)}
		if s.o.Observer != nil {
			s.o.Observer.Left(r.Class, "queue_full", 0)
		}
		s.mu.Unlock()
		return Slot{}, err
	}
	s.seq++
	w := &waiter{req: r, cost: cost, t: t, since: now, seq: s.seq, ready: make(chan struct{})}
	s.pushLocked(w)
	s.dispatchLocked()
	maxWait, after := s.maxWaitLocked(r.Class), s.o.After
	s.mu.Unlock()

	var timeout <-chan time.Time
	if maxWait > 0 {
		ch, stop := after(maxWait)
		defer stop()
		timeout = ch
	}
	var err error
	select {
	case <-w.ready:
		// w.charged was written before ready was closed.
		return Slot{s: s, t: t, cost: cost, weight: r.Weight, charged: w.charged, at: w.at}, nil
	case <-ctx.Done():
		err = ctx.Err()
	case <-timeout:
		err = ErrQueueTimeout
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if w.done {
		// Dispatched as the wait ended: the capacity taken is given back.
		s.releaseLocked(cost)
		t.service = math.Max(0, t.service-w.charged)
		s.serviceChangedLocked(t)
		s.dispatchLocked()
		return Slot{}, s.waitError(err, r.Class)
	}
	s.removeLocked(w)
	if s.o.Observer != nil {
		reason := "canceled"
		if errors.Is(err, ErrQueueTimeout) {
			reason = "queue_timeout"
		}
		s.o.Observer.Left(r.Class, reason, s.o.Now().Sub(w.since))
	}
	s.dispatchLocked()
	return Slot{}, s.waitError(err, r.Class)
}

// TryAcquire takes the request's slot when it may start at once: below capacity with
// nothing waiting. Otherwise it reports false, holds nothing and counts nothing, so
// that the request may try another upstream of its model first. Like Acquire's
// path below capacity, it allocates nothing.
func (s *Scheduler) TryAcquire(r Request) (Slot, bool) {
	if r.Weight <= 0 {
		r.Weight = 1
	}
	if r.Class >= numClasses {
		r.Class = Background
	}
	cost := r.Input + r.Output
	s.mu.Lock()
	if s.waiting != 0 || !s.fits(cost) {
		s.mu.Unlock()
		return Slot{}, false
	}
	return s.startNowLocked(s.tenant(r.Tenant), &r, cost), true
}

// startNowLocked starts a request that did not wait and unlocks the scheduler.
func (s *Scheduler) startNowLocked(t *tenant, r *Request, cost int64) Slot {
	charged := s.startLocked(t, r, cost)
	// A learned bound that reads latency needs the start time; nothing else does.
	var at time.Time
	if s.o.Learn != nil {
		at = s.o.Now()
	}
	starter := s.starter
	s.mu.Unlock()
	// The wait histogram is observed outside the lock every request takes.
	if starter != nil {
		starter.Started(r.Class)
	}
	return Slot{s: s, t: t, cost: cost, weight: r.Weight, charged: charged, at: at}
}

func (s *Scheduler) waitError(err error, c Class) error {
	if errors.Is(err, ErrQueueTimeout) {
		return &WaitError{Err: err, RetryAfter: s.retryAfterLocked(c)}
	}
	return err
}

// maxWaitLocked is the longest wait of class c.
func (s *Scheduler) maxWaitLocked(c Class) time.Duration {
	if w := s.o.ClassMaxQueueWait[c]; w > 0 {
		return w
	}
	return s.o.MaxQueueWait
}

// MaxQueueWait is the longest wait of class c in force.
func (s *Scheduler) MaxQueueWait(c Class) time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.maxWaitLocked(c)
}

func (s *Scheduler) tenant(name string) *tenant {
	t := s.tenants[name]
	if t == nil {
		t = &tenant{}
		s.tenants[name] = t
	}
	return t
}

// fits reports whether a request of cost tokens may start now.
func (s *Scheduler) fits(cost int64) bool {
	if limit := s.maxInFlight(); limit > 0 && s.inReq >= limit {
		return false
	}
	if s.o.MaxInFlightTokens > 0 && s.inTok > 0 && s.inTok+cost > s.o.MaxInFlightTokens {
		return false
	}
	return true
}

// startLocked takes the capacity of a request that starts, and counts its service as
// reserved, which it returns; Done corrects it to what was used.
func (s *Scheduler) startLocked(t *tenant, r *Request, cost int64) float64 {
	s.inReq++
	s.inTok += cost
	charged := (float64(r.Input) + s.o.OutputWeight*float64(r.Output)) / r.Weight
	t.service += charged
	s.serviceChangedLocked(t)
	return charged
}

// releaseLocked gives back the capacity a request of cost tokens held.
func (s *Scheduler) releaseLocked(cost int64) {
	s.inReq--
	s.inTok -= cost
}

// owedLocked reports whether waiting class c's credit covers its next request: it
// has had less than its minimum share of what was dispatched while it waited.
func (s *Scheduler) owedLocked(c int) bool {
	share := s.share(c)
	if share <= 0 {
		return false
	}
	next := s.classes[c].tenants[0].front()
	return s.credit[c] >= (1-share)*float64(max(1, next.cost))
}

// share is class c's minimum share, below 1.
func (s *Scheduler) share(c int) float64 { return min(s.o.MinShare[c], maxShare) }

// creditLocked counts the dispatch of w towards the minimum shares: w's class pays
// for it, and every other class waiting with a share is credited its share of it.
func (s *Scheduler) creditLocked(w *waiter) {
	cost := float64(max(1, w.cost))
	for c := range s.classes {
		share := s.share(c)
		switch {
		case share <= 0:
		case Class(c) == w.req.Class:
			s.credit[c] = math.Max(0, s.credit[c]-(1-share)*cost)
		case s.classes[c].arrivals.Len() > 0:
			s.credit[c] += share * cost
		}
	}
}

// maxShare bounds a minimum share below 1, where the others would get nothing.
const maxShare = 0.99

// drainedLocked counts a dispatch from the queue at now in the drain rate: the time
// since the previous dispatch, or since the queue began to wait when that is later.
func (s *Scheduler) drainedLocked(now time.Time) {
	from := s.lastDispatch
	if s.busySince.After(from) {
		from = s.busySince
	}
	d := now.Sub(from).Seconds()
	if s.interval == 0 {
		s.interval = d
	} else {
		s.interval = 0.8*s.interval + 0.2*d
	}
	s.lastDispatch = now
}

func (s *Scheduler) pushLocked(w *waiter) {
	cq := &s.classes[w.req.Class]
	if tq := w.t.queues[w.req.Class]; tq != nil {
		// Behind the tenant's older waiters: its place in the class is unchanged.
		w.own = tq.waiters.PushBack(w)
	} else {
		// A tenant that starts waiting is lifted to the least service among the
		// tenants already waiting in its class: idle time earns no credit (VTC).
		if len(cq.tenants) > 0 && w.t.service < cq.tenants[0].t.service {
			w.t.service = cq.tenants[0].t.service
			s.serviceChangedLocked(w.t)
		}
		tq = &tenantQueue{t: w.t}
		w.own = tq.waiters.PushBack(w)
		w.t.queues[w.req.Class] = tq
		heap.Push(&cq.tenants, tq)
	}
	w.arrival = cq.arrivals.PushBack(w)
	if s.waiting == 0 {
		s.busySince = w.since
	}
	s.waiting++
	s.waitingBytes += w.req.Bytes
	if s.o.Observer != nil {
		s.o.Observer.Queued(w.req.Class, cq.arrivals.Len())
	}
}

func (s *Scheduler) removeLocked(w *waiter) {
	cq := &s.classes[w.req.Class]
	tq := w.t.queues[w.req.Class]
	first := tq.waiters.Front() == w.own
	tq.waiters.Remove(w.own)
	w.own = nil
	switch {
	case tq.waiters.Len() == 0:
		heap.Remove(&cq.tenants, tq.idx)
		w.t.queues[w.req.Class] = nil
	case first:
		// The tenant's oldest waiter changed, and with it its place on a tie.
		heap.Fix(&cq.tenants, tq.idx)
	}
	cq.arrivals.Remove(w.arrival)
	if cq.arrivals.Len() == 0 {
		// A class that stops waiting keeps no credit.
		s.credit[w.req.Class] = 0
	}
	s.waiting--
	s.waitingBytes -= w.req.Bytes
	if s.o.Observer != nil {
		s.o.Observer.Queued(w.req.Class, cq.arrivals.Len())
	}
}

// next returns the waiter to serve next, or nil when none waits. The class is, among
// the waiting classes owed their minimum share if any, else among all the waiting
// classes, the one whose effective class (its class less one for every Aging its
// oldest waiter has waited) is lowest, on a tie the one whose oldest waiter arrived
// first; in it, the oldest waiter of the tenant with the least service, on a tie of
// service the tenant whose oldest waiter arrived first.
func (s *Scheduler) next(now time.Time) *waiter {
	best, bestOwed, bestRank, bestSeq := -1, false, 0.0, uint64(0)
	for c := range s.classes {
		cq := &s.classes[c]
		front := cq.arrivals.Front()
		if front == nil {
			continue
		}
		oldest := front.Value.(*waiter)
		owed := s.owedLocked(c)
		rank := float64(c)
		if s.o.Aging > 0 {
			rank -= math.Floor(float64(now.Sub(oldest.since)) / float64(s.o.Aging))
		}
		if best < 0 || owed && !bestOwed ||
			owed == bestOwed && (rank < bestRank || rank == bestRank && oldest.seq < bestSeq) {
			best, bestOwed, bestRank, bestSeq = c, owed, rank, oldest.seq
		}
	}
	if best < 0 {
		return nil
	}
	return s.classes[best].tenants[0].front()
}

// dispatchLocked starts waiters while the next one fits.
func (s *Scheduler) dispatchLocked() {
	if s.waiting == 0 {
		return
	}
	now := s.o.Now()
	for s.waiting > 0 {
		w := s.next(now)
		if w == nil || !s.fits(w.cost) {
			return
		}
		s.removeLocked(w)
		if w.claim != nil && !w.claim.state.CompareAndSwap(open, dispatched) {
			// Dispatched by another scheduler, or given up: this copy is dropped.
			continue
		}
		w.charged = s.startLocked(w.t, &w.req, w.cost)
		s.creditLocked(w)
		s.drainedLocked(now)
		w.at = now
		w.done = true
		if s.o.Observer != nil {
			s.o.Observer.Dispatched(w.req.Class, now.Sub(w.since))
		}
		if w.claim != nil {
			w.claim.won = w
		}
		close(w.ready)
	}
}

// retryAfterLocked estimates when the queue will have drained: its length times the
// recent time between dispatches from it (its measured drain rate), at least a second
// and at most class c's longest wait.
func (s *Scheduler) retryAfterLocked(c Class) time.Duration {
	d := time.Duration(float64(s.waiting+1) * s.interval * float64(time.Second))
	if mw := s.maxWaitLocked(c); mw > 0 && d > mw {
		d = mw
	}
	return max(d, time.Second)
}

// DrainInterval is the queue's measured time between dispatches while requests wait
// (zero before any request waited).
func (s *Scheduler) DrainInterval() time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return time.Duration(s.interval * float64(time.Second))
}

// Stats is a snapshot of the scheduler's state.
type Stats struct {
	InFlightRequests, InFlightTokens int64
	Waiting                          [numClasses]int
}

// Stats returns the scheduler's state now.
func (s *Scheduler) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := Stats{InFlightRequests: s.inReq, InFlightTokens: s.inTok}
	for c := range s.classes {
		st.Waiting[c] = s.classes[c].arrivals.Len()
	}
	return st
}

// Service returns the tenant's weighted service so far, in tokens.
func (s *Scheduler) Service(tenant string) float64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if t := s.tenants[tenant]; t != nil {
		return t.service
	}
	return 0
}
