// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

// Package redisstore keeps budget buckets in one Redis server, shared by every replica
// of a fleet, so the fleet enforces one total without dividing it. A reservation on
// every dimension and both periods is one script call: one round trip, all or nothing.
// When Redis cannot be reached, admission falls back to this replica's memory at its
// divided share, or fails closed, as the config says.
package redisstore

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
)

// Options configure a Store.
type Options struct {
	// URL is a redis:// or rediss:// URL for one server, redis+cluster:// for a Redis
	// Cluster, or redis+sentinel:// for a primary found through Sentinel
	// (config.ParseRedisURL).
	URL string
	// Password, when set, replaces the URL's.
	Password string
	// SentinelPassword is the sentinels' own password (a redis+sentinel:// URL).
	SentinelPassword string
	// Prefix namespaces the keys, so several fleets can share one Redis; it is the
	// keys' hash tag. Default "tokenwarden".
	Prefix string
	// DialTimeout, ReadTimeout and WriteTimeout bound every call, so an unreachable
	// Redis costs milliseconds.
	DialTimeout, ReadTimeout, WriteTimeout time.Duration
	// Fallback holds the replica-local buckets used while Redis is unreachable; nil
	// fails closed (budget.UnavailableError: 503 with Retry-After: 5).
	Fallback *budget.Memory
	// Backoff is how long admission goes straight to the fallback after Redis failed,
	// before trying it again. Default 1s.
	Backoff time.Duration
	// RefundLinger is how long refunds gather for a pipeline to take them before they
	// go on their own. Default 1ms.
	RefundLinger time.Duration
	// Clock is this replica's clock. It times only the replica's own decisions (how
	// long admission skips Redis after a failure). It never enters a shared bucket:
	// the scripts read the Redis server's clock (TIME), so replicas whose clocks
	// disagree never credit the difference as refill. The fallback has its own clock.
	Clock budget.Clock
	// Epoch is the epoch of the durable counters the replica runs under
	// (rate_limiting.redis.epoch); empty: the one Redis holds, created when it holds
	// none, at the first durable admission. See SetEpoch.
	Epoch string
	// EpochChanged, when set, is called (it must not block) when the epochs Epochs
	// reports change: an epoch created, set or attested, a fence found or lifted.
	EpochChanged func()
	// LeaseFraction, above 0, serves the global and per-model token budgets from
	// slices of this fraction of their capacity that the replica takes from Redis and
	// spends locally (lease.go); 0 decides every request in Redis.
	LeaseFraction float64
	// Checks configure the store checks (storecheck.go); a zero value runs none.
	Checks CheckOptions
	// Recorder counts the admissions that found Redis unreachable (and, when it is a
	// CheckRecorder, the store checks' results).
	Recorder budget.Recorder
	Logger   *slog.Logger
}

// Store is the Redis store. It implements budget.Store.
type Store struct {
	c      redis.UniversalClient
	prefix string
	// name is the key prefix, the name the fleet's epoch is reported under.
	name string
	// sharded is true on a Redis Cluster: keys are hash-tagged by slot group (see
	// groups.go) and a reservation takes one script call per group it touches.
	sharded bool
	// groups are the slot groups, each with its epoch key (the trust fence): one, the
	// prefix, on one server; SlotGroups on a cluster.
	groups []*group
	// epoch is the fleet's epoch of durable counters that the replica runs under; nil
	// before it has one. Every slot group holds it.
	epoch atomic.Pointer[string]
	// epochMu serialises finding, creating and attesting the epoch.
	epochMu sync.Mutex
	// releases counts the reservations released because a later slot group refused.
	releases atomic.Int64
	// beforeRelease, when set, runs before a release is sent (tests: a master dies
	// between a reservation and its release).
	beforeRelease func()
	// beforeReplay, when set, runs before each call that charges the ledger
	// fallback's spend (tests: a Redis that refuses the first, or loses its answer).
	beforeReplay func()
	// leaseFraction is Options.LeaseFraction; leases the slices held, by bucket key;
	// leaseTakes counts the slices taken.
	leaseFraction float64
	leases        sync.Map
	leaseTakes    atomic.Int64
	// checks are the store checks (storecheck.go).
	checks *checker
	// epochChanged is Options.EpochChanged, or a no-op.
	epochChanged func()
	// fallback holds the replica-local buckets while Redis is unreachable; nil fails
	// closed. A reload may change it (rate_limiting.redis.fallback_to_memory).
	fallback atomic.Pointer[budget.Memory]
	backoff  time.Duration
	linger   time.Duration
	clock    budget.Clock
	rec      budget.Recorder
	log      *slog.Logger
	// durableFallback decides the durable charges it answers while Redis is
	// unreachable (SetDurableFallback); fallbackOwed is set once it admitted one,
	// until its spend is charged to Redis.
	durableFallback atomic.Pointer[DurableFallback]
	fallbackOwed    atomic.Bool
	// downUntil is the time on the replica's clock (Unix nanoseconds) until which
	// admission skips Redis after a failure.
	downUntil atomic.Int64
	// nodesDown holds, on a cluster, the same time per master that failed, by address,
	// and nodesDownUntil the latest of them (nodedown.go).
	nodesDown      sync.Map
	nodesDownUntil atomic.Int64
	// offset is the Redis server's clock minus this replica's (nanoseconds), as the
	// last reservation found it: calendar windows are told on the server's clock.
	offset atomic.Int64
	// shift moves the calendar windows' present, in nanoseconds (tests: a
	// daylight-saving month).
	shift atomic.Int64
	// board holds the board's last value of each name, sent again until it lands.
	board boardRecords
	// q queues script calls for the workers that send them in pipelines: under load
	// many reservations and settlements share one round trip and one syscall
	// (queues.go).
	q queues
	// done closes to stop the workers; stopped closes when they have, after answering
	// the calls they had taken.
	done      chan struct{}
	stopped   chan struct{}
	closeOnce sync.Once
	workers   sync.WaitGroup
}

// New connects lazily: a Redis that is down at start is only unavailable, not fatal.
func New(o Options) (*Store, error) {
	c, sharded, err := newClient(&o)
	if err != nil {
		return nil, fmt.Errorf("rate_limiting.redis.url: %w", err)
	}
	if o.Prefix == "" {
		o.Prefix = "tokenwarden"
	}
	if o.Backoff <= 0 {
		o.Backoff = time.Second
	}
	if o.RefundLinger <= 0 {
		o.RefundLinger = time.Millisecond
	}
	if o.Clock == nil {
		o.Clock = budget.SystemClock{}
	}
	if o.Recorder == nil {
		o.Recorder = budget.NopRecorder{}
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	s := &Store{
		c: c, prefix: "{" + o.Prefix + "}:", name: o.Prefix, sharded: sharded, backoff: o.Backoff, linger: o.RefundLinger,
		clock: o.Clock, rec: o.Recorder, log: o.Logger,
		done: make(chan struct{}), stopped: make(chan struct{}),
	}
	s.groups = s.newGroups()
	s.epochChanged = o.EpochChanged
	if s.epochChanged == nil {
		s.epochChanged = func() {}
	}
	if o.Epoch != "" {
		s.epoch.Store(&o.Epoch)
	}
	if s.checks, err = newChecker(s, &o); err != nil {
		_ = c.Close()
		return nil, err
	}
	s.fallback.Store(o.Fallback)
	s.q.def = s.startQueue("")
	if o.LeaseFraction > 0 {
		s.leaseFraction = min(o.LeaseFraction, 1)
		s.workers.Add(1)
		go s.returnIdle()
	}
	s.startChecks()
	return s, nil
}

// Client is the underlying client (tests read INFO through it): a *redis.Client for
// one server or a Sentinel primary, a *redis.ClusterClient for a cluster.
func (s *Store) Client() redis.UniversalClient { return s.c }

// Key is the Redis key that holds a bucket: {prefix}:DIMENSION:ID, one key for the
// id's request, minute and day buckets of limits; a rule's counter has its own,
// {prefix}:rule:RULE:WINDOW:DIMENSION:LEN:ID:BY, with @START for a calendar window
// (LEN, the id's length, keeps an id and a count_by value that hold colons apart).
// Every key carries the same hash tag, so one request's keys always share a slot.
func (s *Store) Key(k budget.Key) string {
	dim := k.Dim.String()
	prefix := s.prefix
	if s.sharded {
		prefix = s.groups[groupOf(k)].prefix
	}
	if k.Rule != "" {
		key := prefix + "rule:" + k.Rule + ":" + strconv.Itoa(int(k.Window)) + ":" + dim + ":" +
			strconv.Itoa(len(k.ID)) + ":" + k.ID + ":" + k.By
		if k.Kind == budget.Calendar {
			key += "@" + strconv.FormatInt(k.Start, 10)
		}
		return key
	}
	var b strings.Builder
	b.Grow(len(prefix) + len(dim) + 1 + len(k.ID))
	b.WriteString(prefix)
	b.WriteString(dim)
	b.WriteByte(':')
	b.WriteString(k.ID)
	return b.String()
}

// CalendarNow implements budget.CalendarStore: the present on the Redis server's
// clock, as each reservation's reply tells it.
func (s *Store) CalendarNow() (time.Time, time.Duration) {
	shift := time.Duration(s.shift.Load())
	return time.Now().Add(time.Duration(s.offset.Load()) + shift), shift
}

// SetFallback changes what admission does while Redis is unreachable: admit on fallback
// (the replica-local buckets at the divided share), or fail closed when it is nil. A
// reload applies rate_limiting.redis.fallback_to_memory through it; holds taken on the
// fallback before still settle there.
func (s *Store) SetFallback(fallback *budget.Memory) { s.fallback.Store(fallback) }

func (s *Store) down() bool { return s.clock.Now().UnixNano() < s.downUntil.Load() }

func (s *Store) markDown(err error) {
	now := s.clock.Now()
	until := now.Add(s.backoff).UnixNano()
	if cc, ok := s.c.(*redis.ClusterClient); ok {
		// A master may be gone and its replica promoted: ask the cluster who serves
		// which slots before the next try.
		cc.ReloadState(context.Background())
	}
	if prev := s.downUntil.Swap(until); now.UnixNano() < prev {
		return // already down: said once
	}
	action := "admitting on this replica's share of each budget"
	if s.fallback.Load() == nil {
		action = "refusing requests with 503"
	}
	msg := "Redis is unreachable; " + action + " until it answers"
	var refused redis.Error
	if errors.As(err, &refused) {
		// Redis answered, with an error: a reachable server that will not run the
		// scripts needs its operator, not patience.
		msg = "Redis refused the budget scripts; " + action + " until it runs them"
		if strings.Contains(err.Error(), "compiling script") {
			msg += " (tokenwarden needs Redis 7.0 or later)"
		}
	}
	s.log.Warn(msg, "error", err, "retry_in", s.backoff)
}

// Reserve implements budget.Store: one script call for every bucket of the request,
// shared with the other reservations waiting for the same pipeline.
func (s *Store) Reserve(ctx context.Context, r *budget.Reservation) (budget.Result, error) {
	if s.down() {
		return s.unavailable(ctx, r, errors.New("redis marked down after a recent failure"))
	}
	if len(r.Requests)+len(r.Tokens) == 0 {
		return budget.Result{Admitted: true, Backend: s, Shared: true}, nil
	}
	rr, leased := r, (*leasedCharges)(nil)
	if s.leaseFraction > 0 {
		rr, leased = s.takeLeases(ctx, r)
	}
	res, err := s.reserveShared(ctx, rr)
	if down := asDown(err); down != nil {
		leased.giveBack()
		if ctx.Err() != nil {
			return budget.Result{}, ctx.Err()
		}
		s.markDownFor(down.err)
		return s.unavailable(ctx, r, down.err)
	}
	if err == nil && s.fallbackOwed.Load() {
		s.replayFallback()
	}
	if err != nil || !res.Admitted {
		leased.giveBack()
	}
	if err != nil || leased == nil {
		return res, err
	}
	return leased.merge(r, res), nil
}

// downError is a call that could not reach Redis.
type downError struct{ err error }

// asDown is err's *downError, or nil. It looks only when there is an error: the
// target errors.As fills escapes, and an admission should not pay for it.
func asDown(err error) *downError {
	if err == nil {
		return nil
	}
	var down *downError
	if errors.As(err, &down) {
		return down
	}
	return nil
}

func (e *downError) Error() string { return e.err.Error() }

// reserveShared decides a reservation in Redis: one script call on one server, one
// per slot group on a cluster. An error that kept it from Redis is a *downError.
func (s *Store) reserveShared(ctx context.Context, r *budget.Reservation) (budget.Result, error) {
	if len(r.Requests)+len(r.Tokens) == 0 {
		return budget.Result{Admitted: true, Backend: s, Shared: true}, nil
	}
	if fenceable(r) {
		if err := s.checkFence(); err != nil {
			return budget.Result{}, err
		}
		if s.epoch.Load() == nil {
			if err := s.ensureEpoch(ctx); err != nil {
				return budget.Result{}, &downError{err}
			}
		}
	}
	if s.sharded {
		return s.reserveGroups(r)
	}
	rep := s.run(call{kind: reserveCall, reservation: r})
	if rep.err != nil {
		return budget.Result{}, &downError{rep.err}
	}
	return parseReserve(rep.val, r, s, 0)
}

// parseReserve reads the decision of reservation r in slot group g.
func parseReserve(val any, r *budget.Reservation, s *Store, g int) (budget.Result, error) {
	if d, ok := val.(*sumDecision); ok {
		return s.admittedBySum(d, r, g), nil
	}
	n := len(r.Requests) + len(r.Tokens)
	res := budget.Result{
		Backend:        s,
		Shared:         true,
		RequestLevels:  make([]float64, len(r.Requests)),
		TokenLevels:    make([]float64, len(r.Tokens)),
		RequestSkipped: make([]bool, len(r.Requests)),
		TokenSkipped:   make([]bool, len(r.Tokens)),
	}
	out, ok := val.([]any)
	if !ok || len(out) != 7 {
		return budget.Result{}, fmt.Errorf("redis reserve script: reply %v, want 7 values", val)
	}
	if ms, ok := out[6].(int64); ok {
		s.offset.Store(ms*int64(time.Millisecond) - time.Now().UnixNano())
	}
	if w, ok := out[5].(string); ok && len(w) == n && out[2].(int64) != 2 {
		res.RequestWarned, res.TokenWarned = make([]bool, len(r.Requests)), make([]bool, len(r.Tokens))
		for i := range n {
			if i < len(r.Requests) {
				res.RequestWarned[i] = w[i] == '1'
			} else {
				res.TokenWarned[i-len(r.Requests)] = w[i] == '1'
			}
		}
	}
	levels, ok := out[4].(string)
	if !ok || len(levels) != 8*n {
		return budget.Result{}, fmt.Errorf("redis reserve script: levels of %d bytes, want %d", len(levels), 8*n)
	}
	res.Admitted = out[0].(int64) == 1
	if !res.Admitted && out[2].(int64) == 2 {
		found, _ := out[5].(string)
		return budget.Result{}, s.fenced(s.groups[g], found)
	}
	if g := s.groups[g]; g.fence.Load() != nil && fenceable(r) {
		// A durable reservation decided (admitted or refused by a budget) found the
		// epoch again.
		if g.trust() {
			s.epochChanged()
		}
	}
	if !res.Admitted {
		res.Refused = int(out[1].(int64)) - 1
		res.RefusedBy = budget.Requests
		if out[2].(int64) == 1 {
			res.RefusedBy = r.Tokens[res.Refused].Key.Kind
		}
		res.RetryAfter = millis(out[3].(int64))
	}
	for i := 0; i < n; i++ {
		l := math.Float64frombits(binary.LittleEndian.Uint64([]byte(levels[8*i : 8*i+8])))
		if i < len(r.Requests) {
			res.RequestLevels[i] = l
		} else {
			res.TokenLevels[i-len(r.Requests)] = l
		}
	}
	return res, nil
}

// fenceable tells whether a reservation draws on a durable bucket that may refuse
// (a warn rule stays advisory): such a reservation is checked against the trust fence.
func fenceable(r *budget.Reservation) bool {
	for _, group := range [2][]budget.Charge{r.Requests, r.Tokens} {
		for i := range group {
			if group[i].Durable && !group[i].Warn {
				return true
			}
		}
	}
	return false
}

// unavailable answers an admission Redis could not take: on the replica-local
// fallback at the divided share, or fail-closed.
func (s *Store) unavailable(ctx context.Context, r *budget.Reservation, err error) (budget.Result, error) {
	fallback := s.fallback.Load()
	action := "fail_closed"
	if fallback != nil {
		action = "fallback_memory"
	}
	var durable *budget.Charge
	for _, group := range [][]budget.Charge{r.Requests, r.Tokens} {
		for i := range group {
			if group[i].Durable && durable == nil {
				durable = &group[i]
			}
		}
	}
	var durableFallback DurableFallback
	if durable != nil {
		// A calendar window or a cost amount lives only in Redis: it never falls back
		// to a replica's memory, which would start it whole. A durable fallback may
		// answer it from another record of the spend.
		action = "fail_closed"
		if fp := s.durableFallback.Load(); fp != nil && answersAll(*fp, r) && (fallback != nil || onlyDurable(r)) {
			durableFallback, action = *fp, "fallback_ledger"
		}
	}
	var seen [budget.NumDimensions]bool
	for _, group := range [][]budget.Charge{r.Requests, r.Tokens} {
		for _, c := range group {
			if !seen[c.Key.Dim] {
				seen[c.Key.Dim] = true
				s.rec.RedisUnavailable(c.Key.Dim, action)
			}
		}
	}
	if durableFallback != nil {
		return s.reserveDurableFallback(ctx, r, durableFallback, fallback)
	}
	if durable != nil {
		return budget.Result{}, &budget.UnavailableError{Err: fmt.Errorf("rule %q must not fail open: %w", durable.Key.Rule, err)}
	}
	if fallback == nil {
		return budget.Result{}, &budget.UnavailableError{Err: err}
	}
	return fallback.Reserve(ctx, r)
}

// onlyDurable reports whether every charge of r is durable: nothing of it needs the
// replica's memory.
func onlyDurable(r *budget.Reservation) bool {
	if len(r.Requests) > 0 {
		return false
	}
	for i := range r.Tokens {
		if !r.Tokens[i].Durable {
			return false
		}
	}
	return true
}

// Refund implements budget.Store. Refunds gather for up to a millisecond, merged
// bucket by bucket (returning a then b up to the capacity is returning a+b up to it),
// and go with the next pipeline, before its reservations: under load, or when requests
// follow one another, a settlement costs no call of its own. A refund that cannot
// reach Redis is dropped: the bucket returns the budget at its refill rate, which
// bounds the loss to one window. Refund waits until the refund is applied or given
// up; the limiter sends refunds without waiting (SendRefund).
func (s *Store) Refund(_ context.Context, charges []budget.Charge) {
	if s.leaseFraction > 0 {
		charges = s.refundLeased(charges)
	}
	_ = s.refundShared(charges)
}

// SendRefund implements budget.RefundSender: the refund gathers with the others of its
// queue (on a cluster, each master's share with its master's) and rides with the next
// pipeline, or goes on its own after the linger. One that cannot reach Redis is
// dropped and logged: its budget returns at the refill rate (high, never low).
func (s *Store) SendRefund(charges []budget.Charge, wg *sync.WaitGroup) {
	if s.leaseFraction > 0 {
		charges = s.refundLeased(charges)
	}
	var one [1]*refunds
	s.gatherShared(charges, wg, one[:0])
}

// gatherShared gathers charges for the queues that send them and appends the
// gatherings they joined to into, each refund pending on wg when it is not nil.
func (s *Store) gatherShared(charges []budget.Charge, wg *sync.WaitGroup, into []*refunds) []*refunds {
	if len(charges) == 0 {
		return into
	}
	if !s.sharded {
		return append(into, s.gather(s.q.def, charges, wg))
	}
	qs, parts := s.refundQueues(charges)
	for i, q := range qs {
		into = append(into, s.gather(q, parts[i], wg))
	}
	return into
}

// refundShared returns charges to the shared buckets in Redis and waits until they
// are applied; an error when the refund could not reach Redis (it is dropped).
func (s *Store) refundShared(charges []budget.Charge) error {
	var err error
	var one [1]*refunds
	for _, r := range s.gatherShared(charges, nil, one[:0]) {
		select {
		case <-r.done:
			if r.err != nil && err == nil {
				err = r.err
			}
		case <-s.stopped:
			return errClosed
		}
	}
	return err
}

// millis converts the scripts' milliseconds to a Duration, saturating rather than
// wrapping.
func millis(ms int64) time.Duration {
	if ms > int64(budget.MaxDuration/time.Millisecond) {
		return budget.MaxDuration
	}
	return time.Duration(max(ms, 0)) * time.Millisecond
}

// LeaseTakes counts the slices of hot shared budgets taken from Redis (tests and
// diagnostics).
func (s *Store) LeaseTakes() int64 { return s.leaseTakes.Load() }

// Releases counts the reservations released on a cluster because a later slot group
// refused (tests and diagnostics).
func (s *Store) Releases() int64 { return s.releases.Load() }

// Charge implements budget.Store. An overage that cannot reach Redis is not charged.
// On a cluster it is one call per slot group.
func (s *Store) Charge(ctx context.Context, charges []budget.Charge, overage budget.Overage) (taken, debt, levels []float64) {
	n := len(charges)
	all := make([]float64, 3*n)
	taken, debt, levels = all[:n:n], all[n:2*n:2*n], all[2*n:]
	if n == 0 {
		return taken, debt, levels
	}
	if s.sharded {
		if parts := splitCharges(charges); len(parts) > 1 {
			for _, ix := range parts {
				part := make([]budget.Charge, len(ix))
				for j, i := range ix {
					part[j] = charges[i]
				}
				t, d, l := s.Charge(ctx, part, overage)
				for j, i := range ix {
					taken[i], debt[i], levels[i] = t[j], d[j], math.NaN()
					if l != nil {
						levels[i] = l[j]
					}
				}
			}
			return taken, debt, levels
		}
	}
	g := 0
	if s.sharded {
		g = groupOf(charges[0].Key)
	}
	rep := s.run(call{kind: chargeCall, charges: charges, overage: overage, group: g})
	out, ok := rep.val.(string)
	if rep.err != nil || !ok || len(out) != 24*n {
		s.log.Debug("An overage could not reach Redis; it is not charged", "error", rep.err)
		return taken, debt, nil
	}
	for i := range all {
		all[i] = math.Float64frombits(binary.LittleEndian.Uint64([]byte(out[8*i : 8*i+8])))
	}
	return taken, debt, levels
}

// Prune implements budget.Store. Shared keys of a dimension that is gone expire on
// their own; the replica-local fallback buckets are pruned now.
func (s *Store) Prune(keep func(budget.Key) bool) {
	if fallback := s.fallback.Load(); fallback != nil {
		fallback.Prune(keep)
	}
}

// Close implements budget.Store. The workers finish the pipelines they are sending;
// a call still queued, or made after Close, fails as unreachable.
func (s *Store) Close() error {
	err := errClosed
	s.closeOnce.Do(func() {
		qs := s.closeQueues()
		// Under the checks' lock, so that a reload starts no checking goroutine once
		// the workers are waited for.
		s.checks.setMu.Lock()
		close(s.done)
		s.checks.setMu.Unlock()
		s.workers.Wait()
		for _, q := range qs {
			// Refunds no worker took are given up, and so finished: their senders
			// wait for them.
			if r := q.takeRefunds(); r != nil {
				r.finish(errClosed)
			}
		drain:
			for {
				select {
				case c := <-q.calls:
					if c.kind == refundCall {
						c.refunds.finish(errClosed)
					}
				default:
					break drain
				}
			}
		}
		close(s.stopped)
		s.checks.closeChecks()
		err = s.c.Close()
	})
	return err
}

// Level reads a bucket's level now, on the Redis server's clock, and whether it exists
// (tests and diagnostics).
func (s *Store) Level(ctx context.Context, k budget.Key) (float64, bool, error) {
	pipe := s.c.Pipeline()
	now := pipe.Time(ctx)
	get := pipe.Get(ctx, s.Key(k))
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return 0, false, err
	}
	v, err := get.Bytes()
	if errors.Is(err, redis.Nil) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, err
	}
	if len(v) != 104 && len(v) != 96 { // 96: the layout before the expiry was stored
		return 0, false, fmt.Errorf("key %s: %d bytes, want 104", s.Key(k), len(v))
	}
	f := func(i int) float64 { return math.Float64frombits(binary.LittleEndian.Uint64(v[32*int(slot(k))+8*i:])) }
	level, last, capacity, rate := f(0), f(1), f(2), f(3)
	if capacity < 0 {
		return 0, false, nil
	}
	nowMs := float64(now.Val().UnixMicro()) / 1000
	if dt := (nowMs - last) / 1000; dt > 0 {
		level = min(capacity, level+dt*rate)
	}
	return level, true, nil
}

// Peek implements budget.Peeker: the bucket's level in Redis, on the fleet's totals
// (an absent key is a full bucket); while Redis is marked down, the fallback's, which
// then decides.
func (s *Store) Peek(ctx context.Context, ch budget.Charge) (float64, bool, error) {
	if fb := s.fallback.Load(); fb != nil && s.down() {
		return fb.Peek(ctx, ch)
	}
	level, ok, err := s.Level(ctx, ch.Key)
	if err != nil {
		return 0, true, fmt.Errorf("read %s: %w", s.Key(ch.Key), err)
	}
	if !ok {
		return ch.SharedCapacity, true, nil
	}
	return level, true, nil
}
