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
	done  chan struct{}
}

// call is one script call waiting for a pipeline; done receives its command, which
// holds the reply or the error.
type call struct {
	script *redis.Script
	keys   []string
	args   []any
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
		calls: make(chan call, callQueue), done: make(chan struct{}),
	}
	for range pipelineWorkers {
		go s.pipeline()
	}
	return s, nil
}

// Client is the underlying client (tests read INFO through it).
func (s *Store) Client() *redis.Client { return s.c }

var kindTags = [budget.NumKinds]string{"r", "m", "d"}

// Key is a bucket's Redis key: {prefix}:KIND:DIMENSION:ID. Every key carries the same
// hash tag, so one request's keys always share a slot.
func (s *Store) Key(k budget.Key) string {
	var b strings.Builder
	b.Grow(len(s.prefix) + 12 + len(k.ID))
	b.WriteString(s.prefix)
	b.WriteString(kindTags[k.Kind])
	b.WriteByte(':')
	b.WriteString(k.Dim.String())
	b.WriteByte(':')
	b.WriteString(k.ID)
	return b.String()
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
	keys := make([]string, 0, n)
	args := make([]any, 0, 3+3*n)
	args = append(args, s.nowMillis(), len(r.Requests), r.Amount)
	for _, group := range [][]budget.Charge{r.Requests, r.Tokens} {
		for _, c := range group {
			keys = append(keys, s.Key(c.Key))
			args = append(args, c.SharedCapacity, c.SharedRate, c.Key.Kind.Period().Milliseconds())
		}
	}
	out, err := s.run(ctx, reserveScript, keys, args).Slice()
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
	if len(out) != 4+n {
		return budget.Result{}, fmt.Errorf("redis reserve script: %d replies, want %d", len(out), 4+n)
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
		milli, ok := out[4+i].(int64)
		if !ok {
			return budget.Result{}, fmt.Errorf("redis reserve script: level %v is not an integer", out[4+i])
		}
		l := float64(milli) / 1000
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

// Refund implements budget.Store. A refund that cannot reach Redis is dropped: the
// bucket returns the budget at its refill rate, which bounds the loss to one window.
func (s *Store) Refund(ctx context.Context, charges []budget.Charge, amount float64) {
	_, _ = s.adjust(ctx, charges, "refund", amount)
}

// Charge implements budget.Store. An overage that cannot reach Redis is not charged.
func (s *Store) Charge(ctx context.Context, charges []budget.Charge, amount float64) []bool {
	applied, _ := s.adjust(ctx, charges, "charge", amount)
	if applied == nil {
		applied = make([]bool, len(charges))
	}
	return applied
}

func (s *Store) adjust(ctx context.Context, charges []budget.Charge, mode string, amount float64) ([]bool, error) {
	if len(charges) == 0 {
		return nil, nil
	}
	keys := make([]string, len(charges))
	args := make([]any, 0, 3+2*len(charges))
	args = append(args, s.nowMillis(), mode, amount)
	for i, c := range charges {
		keys[i] = s.Key(c.Key)
		args = append(args, c.SharedCapacity, c.SharedRate)
	}
	// The caller is the hold's detached settlement goroutine: waiting here never blocks
	// a request.
	out, err := s.run(ctx, adjustScript, keys, args).Int64Slice()
	if err != nil {
		s.log.Debug("A settlement could not reach Redis; its budget returns at the refill rate", "mode", mode, "error", err)
		return nil, err
	}
	applied := make([]bool, len(out))
	for i, v := range out {
		applied[i] = v == 1
	}
	return applied, nil
}

var errQueueFull = errors.New("redis: too many calls waiting")

// run queues a script call for the pipeline workers and waits for its reply.
func (s *Store) run(ctx context.Context, script *redis.Script, keys []string, args []any) *redis.Cmd {
	c := call{script: script, keys: keys, args: args, done: make(chan *redis.Cmd, 1)}
	select {
	case s.calls <- c:
	default:
		cmd := redis.NewCmd(ctx)
		cmd.SetErr(errQueueFull)
		return cmd
	}
	// Always wait for the reply, even for a caller that went away: a reservation the
	// worker made must reach the caller, whose hold then releases it.
	return <-c.done
}

// pipeline sends queued calls, as many as are waiting, in one pipeline.
func (s *Store) pipeline() {
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

func (s *Store) send(batch []call, cmds []*redis.Cmd) []*redis.Cmd {
	ctx := context.Background()
	exec := func() error {
		cmds = cmds[:0]
		pipe := s.c.Pipeline()
		for _, c := range batch {
			cmds = append(cmds, c.script.EvalSha(ctx, pipe, c.keys, c.args...))
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

// Prune implements budget.Store. Shared keys of a dimension that is gone expire on
// their own; the replica-local fallback buckets are pruned now.
func (s *Store) Prune(keep func(budget.Key) bool) {
	if s.fallback != nil {
		s.fallback.Prune(keep)
	}
}

// Close implements budget.Store.
func (s *Store) Close() error {
	close(s.done)
	return s.c.Close()
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
	if len(v) != 32 {
		return 0, false, fmt.Errorf("bucket %s: %d bytes, want 32", s.Key(k), len(v))
	}
	f := func(i int) float64 { return math.Float64frombits(binary.LittleEndian.Uint64(v[8*i:])) }
	level, last, capacity, rate := f(0), f(1), f(2), f(3)
	if dt := float64(s.nowMillis()-int64(last)) / 1000; dt > 0 {
		level = min(capacity, level+dt*rate)
	}
	return level, true, nil
}
