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
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
)

// Options configure a Store.
type Options struct {
	// URL is a single server's redis:// or rediss:// URL.
	URL string
	// Password, when set, replaces the URL's.
	Password string
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
	Clock   budget.Clock
	// Recorder counts the admissions that found Redis unreachable.
	Recorder budget.Recorder
	Logger   *slog.Logger
}

// Store is the Redis store. It implements budget.Store.
type Store struct {
	c        *redis.Client
	prefix   string
	fallback *budget.Memory
	backoff  time.Duration
	clock    budget.Clock
	rec      budget.Recorder
	log      *slog.Logger
	// downUntil is the wall-clock time (Unix nanoseconds) until which admission skips
	// Redis after a failure.
	downUntil atomic.Int64
	// calls queue script calls for the workers that send them in pipelines: under
	// load many reservations and settlements share one round trip and one syscall.
	calls chan call
	// done closes to stop the workers; stopped closes when they have, after answering
	// the calls they had taken.
	done      chan struct{}
	stopped   chan struct{}
	closeOnce sync.Once
	workers   sync.WaitGroup
}

// call is one script call waiting for a pipeline, or a refund to merge with the other
// refunds waiting; done receives its command, which holds the reply or the error.
type call struct {
	script *redis.Script
	keys   []string
	args   []any
	// refund and amount are a refund's buckets and the amount returned to each, when
	// script is nil.
	refund []budget.Charge
	amount float64
	done   chan *redis.Cmd
}

const (
	// callQueue bounds the calls waiting for Redis. Beyond it a reservation is
	// answered as unavailable and a settlement is dropped (its budget returns at the
	// refill rate) rather than blocking anything.
	callQueue = 4096
	// pipelineWorkers send the queued calls; each waits for its pipeline's replies.
	pipelineWorkers = 4
	// maxPipeline bounds the calls in one pipeline.
	maxPipeline = 64
)

// New connects lazily: a Redis that is down at start is only unavailable, not fatal.
func New(o Options) (*Store, error) {
	opts, err := redis.ParseURL(o.URL)
	if err != nil {
		return nil, fmt.Errorf("rate_limiting.redis.url: %w", err)
	}
	if o.Password != "" {
		opts.Password = o.Password
	}
	opts.DialTimeout, opts.ReadTimeout, opts.WriteTimeout = o.DialTimeout, o.ReadTimeout, o.WriteTimeout
	opts.PoolTimeout = o.DialTimeout + o.ReadTimeout
	// A retry multiplies the cost of an outage; the fallback is the retry.
	opts.MaxRetries = -1
	opts.DialerRetries = 1
	opts.ContextTimeoutEnabled = true
	if o.Prefix == "" {
		o.Prefix = "tokenwarden"
	}
	if o.Backoff <= 0 {
		o.Backoff = time.Second
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
		c: redis.NewClient(opts), prefix: "{" + o.Prefix + "}:", fallback: o.Fallback, backoff: o.Backoff,
		clock: o.Clock, rec: o.Recorder, log: o.Logger,
		calls: make(chan call, callQueue), done: make(chan struct{}), stopped: make(chan struct{}),
	}
	s.workers.Add(pipelineWorkers)
	for range pipelineWorkers {
		go s.pipeline()
	}
	return s, nil
}

// Client is the underlying client (tests read INFO through it).
func (s *Store) Client() *redis.Client { return s.c }

// Key is the Redis key that holds a bucket: {prefix}:DIMENSION:ID, one key for the
// id's request, minute and day buckets. Every key carries the same hash tag, so one
// request's keys always share a slot.
func (s *Store) Key(k budget.Key) string {
	dim := k.Dim.String()
	var b strings.Builder
	b.Grow(len(s.prefix) + len(dim) + 1 + len(k.ID))
	b.WriteString(s.prefix)
	b.WriteString(dim)
	b.WriteByte(':')
	b.WriteString(k.ID)
	return b.String()
}

// spec lays out one script call's buckets: the keys, one per dimension and id in the
// order first seen, and the binary bucket spec (see scripts.go).
type spec struct {
	ids  []budget.Key
	keys []string
	// byID indexes ids once there are many (a call merging many refunds).
	byID map[budget.Key]int
	buf  []byte
}

func newSpec(buckets int) *spec {
	return &spec{
		ids:  make([]budget.Key, 0, min(buckets, int(budget.NumDimensions))),
		keys: make([]string, 0, min(buckets, int(budget.NumDimensions))),
		buf:  make([]byte, 0, buckets*specSize),
	}
}

// add appends one bucket with the script's three numbers for it.
func (p *spec) add(s *Store, k budget.Key, x, y, z float64) {
	p.buf = binary.LittleEndian.AppendUint16(p.buf, uint16(p.index(s, k)))
	p.buf = append(p.buf, byte(k.Kind))
	p.buf = binary.LittleEndian.AppendUint64(p.buf, math.Float64bits(x))
	p.buf = binary.LittleEndian.AppendUint64(p.buf, math.Float64bits(y))
	p.buf = binary.LittleEndian.AppendUint64(p.buf, math.Float64bits(z))
}

// index is the 1-based index in keys of the key holding k.
func (p *spec) index(s *Store, k budget.Key) int {
	k.Kind = 0
	if p.byID != nil {
		if i, ok := p.byID[k]; ok {
			return i
		}
	} else {
		for i, id := range p.ids {
			if id == k {
				return i + 1
			}
		}
	}
	p.ids = append(p.ids, k)
	p.keys = append(p.keys, s.Key(k))
	if p.byID == nil && len(p.ids) > 8 {
		p.byID = make(map[budget.Key]int, 2*len(p.ids))
		for i, id := range p.ids {
			p.byID[id] = i + 1
		}
	} else if p.byID != nil {
		p.byID[k] = len(p.ids)
	}
	return len(p.ids)
}

func (s *Store) nowMillis() int64 { return s.clock.Now().UnixMilli() }

func (s *Store) down() bool { return time.Now().UnixNano() < s.downUntil.Load() }

func (s *Store) markDown(err error) {
	until := time.Now().Add(s.backoff).UnixNano()
	if prev := s.downUntil.Swap(until); time.Now().UnixNano() >= prev {
		s.log.Warn("Redis is unreachable; admitting on the fallback until it answers", "error", err,
			"fallback", s.fallback != nil, "retry_in", s.backoff)
	}
}

// Reserve implements budget.Store: one script call for every bucket of the request.
func (s *Store) Reserve(ctx context.Context, r *budget.Reservation) (budget.Result, error) {
	if s.down() {
		return s.unavailable(ctx, r, errors.New("redis marked down after a recent failure"))
	}
	n := len(r.Requests) + len(r.Tokens)
	if n == 0 {
		return budget.Result{Admitted: true, Backend: s, Shared: true}, nil
	}
	p := newSpec(n)
	for _, group := range [][]budget.Charge{r.Requests, r.Tokens} {
		for _, c := range group {
			p.add(s, c.Key, c.SharedCapacity, c.SharedRate, float64(c.Key.Kind.Period().Milliseconds()))
		}
	}
	args := []any{s.nowMillis(), len(r.Requests), r.Amount, p.buf}
	out, err := s.run(ctx, call{script: reserveScript, keys: p.keys, args: args}).Slice()
	if err != nil {
		if ctx.Err() != nil {
			return budget.Result{}, ctx.Err()
		}
		s.markDown(err)
		return s.unavailable(ctx, r, err)
	}
	return parseReserve(out, r, s)
}

func parseReserve(out []any, r *budget.Reservation, s *Store) (budget.Result, error) {
	n := len(r.Requests) + len(r.Tokens)
	if len(out) != 5 {
		return budget.Result{}, fmt.Errorf("redis reserve script: %d replies, want 5", len(out))
	}
	levels, ok := out[4].(string)
	if !ok || len(levels) != 8*n {
		return budget.Result{}, fmt.Errorf("redis reserve script: levels of %d bytes, want %d", len(levels), 8*n)
	}
	res := budget.Result{
		Backend:        s,
		Shared:         true,
		RequestLevels:  make([]float64, len(r.Requests)),
		TokenLevels:    make([]float64, len(r.Tokens)),
		RequestSkipped: make([]bool, len(r.Requests)),
		TokenSkipped:   make([]bool, len(r.Tokens)),
	}
	res.Admitted = out[0].(int64) == 1
	if !res.Admitted {
		res.Refused = int(out[1].(int64)) - 1
		res.RefusedBy = budget.Requests
		if out[2].(int64) == 1 {
			res.RefusedBy = r.Tokens[res.Refused].Key.Kind
		}
		res.RetryAfter = time.Duration(out[3].(int64)) * time.Millisecond
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

// unavailable answers an admission Redis could not take: on the replica-local
// fallback at the divided share, or fail-closed.
func (s *Store) unavailable(ctx context.Context, r *budget.Reservation, err error) (budget.Result, error) {
	action := "fail_closed"
	if s.fallback != nil {
		action = "fallback_memory"
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
	if s.fallback == nil {
		return budget.Result{}, &budget.UnavailableError{Err: err}
	}
	return s.fallback.Reserve(ctx, r)
}

// Refund implements budget.Store. Refunds waiting for a pipeline together are merged
// into one script call, bucket by bucket (returning a then b up to the capacity is
// returning a+b up to it), so under load a settlement costs a fraction of a call. A
// refund that cannot reach Redis is dropped: the bucket returns the budget at its
// refill rate, which bounds the loss to one window.
func (s *Store) Refund(ctx context.Context, charges []budget.Charge, amount float64) {
	if len(charges) == 0 || amount <= 0 {
		return
	}
	// The caller is the hold's detached settlement goroutine: waiting here never blocks
	// a request.
	if err := s.run(ctx, call{refund: charges, amount: amount}).Err(); err != nil {
		s.log.Debug("A refund could not reach Redis; its budget returns at the refill rate", "error", err)
	}
}

// Charge implements budget.Store. An overage that cannot reach Redis is not charged.
func (s *Store) Charge(ctx context.Context, charges []budget.Charge, amount float64) []bool {
	applied := make([]bool, len(charges))
	if len(charges) == 0 {
		return applied
	}
	p := newSpec(len(charges))
	for _, c := range charges {
		p.add(s, c.Key, c.SharedCapacity, c.SharedRate, amount)
	}
	out, err := s.run(ctx, call{script: adjustScript, keys: p.keys, args: []any{s.nowMillis(), "charge", p.buf}}).Int64Slice()
	if err != nil {
		s.log.Debug("An overage could not reach Redis; it is not charged", "error", err)
		return applied
	}
	for i, v := range out {
		applied[i] = i < len(applied) && v == 1
	}
	return applied
}

var (
	errQueueFull = errors.New("redis: too many calls waiting")
	errClosed    = errors.New("redis: the store is closed")
)

func failed(ctx context.Context, err error) *redis.Cmd {
	cmd := redis.NewCmd(ctx)
	cmd.SetErr(err)
	return cmd
}

// run queues a call for the pipeline workers and waits for its reply.
func (s *Store) run(ctx context.Context, c call) *redis.Cmd {
	c.done = make(chan *redis.Cmd, 1)
	select {
	case <-s.done:
		return failed(ctx, errClosed)
	default:
	}
	select {
	case s.calls <- c:
	default:
		return failed(ctx, errQueueFull)
	}
	// Always wait for the reply, even for a caller that went away: a reservation the
	// worker made must reach the caller, whose hold then releases it.
	select {
	case cmd := <-c.done:
		return cmd
	case <-s.stopped:
		select {
		case cmd := <-c.done:
			return cmd
		default:
			return failed(ctx, errClosed)
		}
	}
}

// pipeline sends queued calls, as many as are waiting, in one pipeline.
func (s *Store) pipeline() {
	defer s.workers.Done()
	batch := make([]call, 0, maxPipeline)
	cmds := make([]*redis.Cmd, 0, maxPipeline)
	for {
		select {
		case <-s.done:
			return
		case c := <-s.calls:
			batch = append(batch[:0], c)
		}
	drain:
		for len(batch) < maxPipeline {
			select {
			case c := <-s.calls:
				batch = append(batch, c)
			default:
				break drain
			}
		}
		cmds = s.send(batch, cmds[:0])
		for i, c := range batch {
			c.done <- cmds[i]
		}
	}
}

// send sends a batch in one pipeline and returns each call's command. The batch's
// refunds go as one merged call, in the place of the first of them.
func (s *Store) send(batch []call, cmds []*redis.Cmd) []*redis.Cmd {
	ctx := context.Background()
	refund := s.mergeRefunds(batch)
	exec := func() error {
		cmds = cmds[:0]
		var merged *redis.Cmd
		pipe := s.c.Pipeline()
		for _, c := range batch {
			switch {
			case c.script != nil:
				cmds = append(cmds, c.script.EvalSha(ctx, pipe, c.keys, c.args...))
			case merged == nil:
				merged = refund.script.EvalSha(ctx, pipe, refund.keys, refund.args...)
				cmds = append(cmds, merged)
			default:
				cmds = append(cmds, merged)
			}
		}
		_, err := pipe.Exec(ctx)
		return err
	}
	err := exec()
	if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
		// Redis restarted and lost the scripts: load them and send the batch again.
		if err = reserveScript.Load(ctx, s.c).Err(); err == nil {
			if err = adjustScript.Load(ctx, s.c).Err(); err == nil {
				_ = exec()
			}
		}
	}
	return cmds
}

// refundBucket identifies a bucket and the parameters a hold recorded on it: refunds
// merge when both match.
type refundBucket struct {
	key            budget.Key
	capacity, rate float64
}

// mergeRefunds builds one adjust call returning every refund in the batch, with one
// entry per bucket and recorded parameters.
func (s *Store) mergeRefunds(batch []call) call {
	var (
		order   []refundBucket
		amounts map[refundBucket]float64
	)
	for _, c := range batch {
		if c.script != nil {
			continue
		}
		if amounts == nil {
			amounts = make(map[refundBucket]float64, len(c.refund))
		}
		for _, ch := range c.refund {
			b := refundBucket{key: ch.Key, capacity: ch.SharedCapacity, rate: ch.SharedRate}
			if _, ok := amounts[b]; !ok {
				order = append(order, b)
			}
			amounts[b] += c.amount
		}
	}
	if amounts == nil {
		return call{}
	}
	p := newSpec(len(order))
	for _, b := range order {
		p.add(s, b.key, b.capacity, b.rate, amounts[b])
	}
	return call{script: adjustScript, keys: p.keys, args: []any{s.nowMillis(), "refund", p.buf}}
}

// Prune implements budget.Store. Shared keys of a dimension that is gone expire on
// their own; the replica-local fallback buckets are pruned now.
func (s *Store) Prune(keep func(budget.Key) bool) {
	if s.fallback != nil {
		s.fallback.Prune(keep)
	}
}

// Close implements budget.Store. The workers finish the pipelines they are sending;
// a call still queued, or made after Close, fails as unreachable.
func (s *Store) Close() error {
	err := errClosed
	s.closeOnce.Do(func() {
		close(s.done)
		s.workers.Wait()
		close(s.stopped)
		err = s.c.Close()
	})
	return err
}

// Level reads a bucket's level now, and whether it exists (tests and diagnostics).
func (s *Store) Level(ctx context.Context, k budget.Key) (float64, bool, error) {
	v, err := s.c.Get(ctx, s.Key(k)).Bytes()
	if errors.Is(err, redis.Nil) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, err
	}
	if len(v) != 96 {
		return 0, false, fmt.Errorf("key %s: %d bytes, want 96", s.Key(k), len(v))
	}
	f := func(i int) float64 { return math.Float64frombits(binary.LittleEndian.Uint64(v[32*int(k.Kind)+8*i:])) }
	level, last, capacity, rate := f(0), f(1), f(2), f(3)
	if capacity < 0 {
		return 0, false, nil
	}
	if dt := float64(s.nowMillis()-int64(last)) / 1000; dt > 0 {
		level = min(capacity, level+dt*rate)
	}
	return level, true, nil
}
