// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

// Package health tracks the upstreams' health for routing: a circuit breaker per
// upstream, opened by its failures, and a cooldown per upstream credential after a
// 429 of rate pressure or an answer saying its account is out of credit (billing),
// which the fleet shares through a Board. It keeps state across config reloads and
// reads time from an injected clock.
package health

import (
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tokenwarden/tokenwarden/proxy/config"
)

// State is a breaker's state.
type State uint8

// Breaker states.
const (
	// Closed: the upstream takes requests.
	Closed State = iota
	// Open: the upstream is out of candidacy until its wait ends.
	Open
	// HalfOpen: a few probe requests decide whether it closes again.
	HalfOpen
)

func (s State) String() string {
	switch s {
	case Open:
		return "open"
	case HalfOpen:
		return "half_open"
	}
	return "closed"
}

// Outcome is what one call to an upstream told of its health.
type Outcome uint8

// Outcomes.
const (
	// Success: the upstream answered (a caller's 4xx mistake included).
	Success Outcome = iota
	// Failure: a 5xx, a timeout or a connection error.
	Failure
	// Unrecorded: the call ended without telling (the client went away, or a 429,
	// which cools the credential instead).
	Unrecorded
)

// window is the number of most recent calls a closed breaker judges by.
const window = 20

// Breaker is one upstream's circuit breaker: it opens after at least
// config.BreakerMinCalls recorded calls of which half or more failed, stays open
// config.BreakerOpenFor, then lets config.BreakerProbes probes through; as many
// successes close it, and a failure opens it again.
type Breaker struct {
	// closed mirrors state == Closed, so that Allow and Available of a closed breaker
	// (nearly every call) take no lock.
	closed atomic.Bool
	// opened is set at the first open: until then the zero value reads closed.
	opened atomic.Bool
	mu     sync.Mutex
	// state and until: an open breaker's wait ends at until.
	state State
	until time.Time
	// calls is a ring of the last recorded outcomes of a closed breaker (true: failed).
	calls  [window]bool
	n, pos int
	// probes issued and succeeded while half-open.
	issued, passed int
}

// Allow reports whether a request may go to the upstream now; a half-open breaker
// counts the probe it lets through, so each Allow that returns true must be followed
// by one Record.
func (b *Breaker) Allow(now time.Time) bool {
	if b.closedNow() {
		return true
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	switch b.state {
	case Open:
		if now.Before(b.until) {
			return false
		}
		b.state, b.issued, b.passed = HalfOpen, 0, 0
		fallthrough
	case HalfOpen:
		if b.issued >= config.BreakerProbes {
			return false
		}
		b.issued++
	}
	return true
}

// Available reports, without taking a probe, whether Allow would let a request
// through now; when it would not, at is when it may again.
func (b *Breaker) Available(now time.Time) (ok bool, at time.Time) {
	if b.closedNow() {
		return true, time.Time{}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	switch b.state {
	case Open:
		if now.Before(b.until) {
			return false, b.until
		}
	case HalfOpen:
		if b.issued >= config.BreakerProbes {
			// The probes in flight decide; retry after one more wait at most.
			return false, now.Add(time.Second)
		}
	}
	return true, time.Time{}
}

// Record records a call's outcome; it returns the state after it.
func (b *Breaker) Record(now time.Time, o Outcome) State {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch b.state {
	case HalfOpen:
		switch o {
		case Failure:
			b.open(now)
		case Success:
			b.passed++
			if b.passed >= config.BreakerProbes {
				b.state, b.n, b.pos = Closed, 0, 0
				b.closed.Store(true)
			}
		default:
			// The probe told nothing: another may go.
			b.issued = max(0, b.issued-1)
		}
	case Closed:
		if o == Unrecorded {
			break
		}
		b.calls[b.pos] = o == Failure
		b.pos = (b.pos + 1) % window
		b.n = min(b.n+1, window)
		failed := 0
		for i := range b.n {
			if b.calls[i] {
				failed++
			}
		}
		if b.n >= config.BreakerMinCalls && 2*failed >= b.n {
			b.open(now)
		}
	}
	return b.state
}

func (b *Breaker) open(now time.Time) {
	b.state, b.until, b.n, b.pos = Open, now.Add(config.BreakerOpenFor), 0, 0
	b.closed.Store(false)
	b.opened.Store(true)
}

// closedNow reports whether the breaker is closed, without the lock. A Breaker's zero
// value is closed: opened is the flag's negation until the first open.
func (b *Breaker) closedNow() bool { return !b.opened.Load() || b.closed.Load() }

// State is the breaker's state as of now (an open breaker whose wait ended reads
// half-open).
func (b *Breaker) State(now time.Time) State {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.state == Open && !now.Before(b.until) {
		return HalfOpen
	}
	return b.state
}

// Registry holds the breakers by upstream name and the cooldowns by credential.
// It is safe for concurrent use.
type Registry struct {
	mu        sync.Mutex
	breakers  map[string]*Breaker
	cooldowns map[string]*Cooldown
	// board shares the billing cooldowns with the fleet (nil: this replica's own).
	board Board
	log   *slog.Logger
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry {
	return &Registry{breakers: map[string]*Breaker{}, cooldowns: map[string]*Cooldown{}}
}

// Breaker is the upstream's breaker, made on first use.
func (r *Registry) Breaker(upstream string) *Breaker {
	r.mu.Lock()
	defer r.mu.Unlock()
	b := r.breakers[upstream]
	if b == nil {
		b = &Breaker{}
		r.breakers[upstream] = b
	}
	return b
}

// Cooldown is the credential's cooldown, made on first use.
func (r *Registry) Cooldown(credential string) *Cooldown {
	r.mu.Lock()
	defer r.mu.Unlock()
	c := r.cooldowns[credential]
	if c == nil {
		c = &Cooldown{notify: r.notifier(credential)}
		r.cooldowns[credential] = c
	}
	return c
}

// Forget drops the state of upstreams and credentials a config no longer has.
func (r *Registry) Forget(keepUpstream, keepCredential func(string) bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for k := range r.breakers {
		if !keepUpstream(k) {
			delete(r.breakers, k)
		}
	}
	for k := range r.cooldowns {
		if !keepCredential(k) {
			delete(r.cooldowns, k)
		}
	}
}

// Cooldown is one credential's clock: after a 429 of rate pressure it is out of
// candidacy until the time the upstream named; after an answer saying its account is
// out of credit (billing), until a probe finds the account answering again, which a
// replica sends once the billing interval has passed.
type Cooldown struct {
	mu    sync.Mutex
	until time.Time
	// untilNanos mirrors until for the lock-free Until (0: never cooled).
	untilNanos atomic.Int64
	// billing is set while a billing cooldown holds, interval passed or not.
	billing atomic.Bool
	// probing is set while this replica's own probe of a billing cooldown is out;
	// lastProbe is when it sent the last.
	probing   atomic.Bool
	lastProbe time.Time
	// cur is the last cooldown learned.
	cur Cooling
	// total is the time spent cooling for rate pressure since the start, for the
	// share-of-time alert.
	total time.Duration
	// notify, when set, is told of a billing cooldown learned or cleared here (not of
	// one learned from the fleet): the registry shares it.
	notify func(Cooling, bool)
}

// Start cools the credential for d from now, for rate pressure (a later end replaces
// an earlier one).
func (c *Cooldown) Start(now time.Time, d time.Duration) {
	c.Rate(now, Interval{Applied: d, Requested: d, Source: SourceDefault}, "")
}

// Rate cools the credential for rate pressure for iv.Applied from now, after an
// answer of upstream; a later end replaces an earlier one. A billing cooldown in
// force stays.
func (c *Cooldown) Rate(now time.Time, iv Interval, upstream string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	end := now.Add(iv.Applied)
	if c.billing.Load() || !end.After(c.until) {
		return
	}
	from := now
	if c.until.After(now) {
		from = c.until
	}
	c.total += end.Sub(from)
	c.setUntil(end)
	c.cur = Cooling{Reason: ReasonRate, Since: now, Until: end, Requested: iv.Requested, Applied: iv.Applied, Source: iv.Source, Upstream: upstream}
}

// Bill puts the credential on a billing cooldown (b.Reason is set to billing), replacing
// whatever cooldown is in force, and tells the fleet.
func (c *Cooldown) Bill(b Cooling) {
	b.Reason = ReasonBilling
	c.mu.Lock()
	c.cur = b
	c.setUntil(b.Until)
	c.billing.Store(true)
	notify := c.notify
	c.mu.Unlock()
	if notify != nil {
		notify(b, false)
	}
}

// Clear ends a billing cooldown at now (a probe found the account answering) and
// tells the fleet; it reports whether one was in force.
func (c *Cooldown) Clear(now time.Time) bool {
	c.mu.Lock()
	if !c.billing.Load() {
		c.mu.Unlock()
		return false
	}
	c.billing.Store(false)
	c.setUntil(now)
	cleared := c.cur
	cleared.Until = now
	c.cur = Cooling{}
	notify := c.notify
	c.mu.Unlock()
	if notify != nil {
		notify(cleared, true)
	}
	return true
}

// Learn applies what another replica shared: a billing cooldown that began after the
// one known here, or the clear of one (cleared) that began no later than it.
func (c *Cooldown) Learn(b Cooling, cleared bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case cleared:
		if c.billing.Load() && !c.cur.Since.After(b.Since) {
			c.billing.Store(false)
			c.setUntil(b.Until)
			c.cur = Cooling{}
		}
	case !c.billing.Load() || b.Since.After(c.cur.Since):
		b.Reason = ReasonBilling
		c.cur = b
		c.setUntil(b.Until)
		c.billing.Store(true)
	}
}

func (c *Cooldown) setUntil(t time.Time) {
	c.until = t
	c.untilNanos.Store(t.UnixNano())
}

// Until is when the cooldown's interval ends; zero or past when it is not cooling
// for rate pressure (a billing cooldown holds past it: Out).
func (c *Cooldown) Until() time.Time {
	n := c.untilNanos.Load()
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n).UTC()
}

// Out reports whether the credential is out of candidacy at now: cooling, or on a
// billing cooldown not yet cleared.
func (c *Cooldown) Out(now time.Time) bool { return c.billing.Load() || now.Before(c.Until()) }

// Due reports whether a billing cooldown's interval has passed at now, so that a
// probe may decide it.
func (c *Cooldown) Due(now time.Time) bool { return c.billing.Load() && !now.Before(c.Until()) }

// State is the cooldown in force at now; ok is false when the credential is not out.
func (c *Cooldown) State(now time.Time) (Cooling, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.billing.Load() && !now.Before(c.until) {
		return Cooling{}, false
	}
	return c.cur, true
}

// TryProbe reports whether this replica may send its own probe of a billing cooldown
// due at now: none of its own is out, and its last was every or longer ago. A true
// answer must be followed by ProbeDone.
func (c *Cooldown) TryProbe(now time.Time, every time.Duration) bool {
	if !c.Due(now) || !c.probing.CompareAndSwap(false, true) {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.lastProbe.IsZero() && now.Sub(c.lastProbe) < every {
		c.probing.Store(false)
		return false
	}
	c.lastProbe = now
	return true
}

// ProbeDone says this replica's own probe came back.
func (c *Cooldown) ProbeDone() { c.probing.Store(false) }

// Seconds is the total time the credential has been put on cooldown for rate
// pressure, in seconds: a counter, whose rate is the share of time it cools.
func (c *Cooldown) Seconds() float64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.total.Seconds()
}
