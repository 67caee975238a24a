// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package ledger

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// FullPolicy is what the proxy does while the spool is full and the sink unreachable:
// what is settled then cannot be recorded.
type FullPolicy string

const (
	// KeepServing serves on and counts what could not be recorded. The budgets are
	// still enforced by their counters; only the record has a gap, of a counted size.
	KeepServing FullPolicy = "keep-serving"
	// Refuse refuses the requests that cost budgets govern until the spool has room,
	// for a fleet whose record must have no gap: the batch that found no room is kept
	// in memory rather than dropped, while the rows held stay under MaxRows.
	Refuse FullPolicy = "refuse"
)

// Config configures a Ledger. Only Sink is required.
type Config struct {
	// Sink is where rollups are recorded.
	Sink Sink
	// Pod names this replica (default: the host name). With the start epoch of its
	// spool it is the replica's identity, one part of every idempotency key.
	Pod string
	// SpoolDir is where batches wait while the sink is unreachable (the pod's
	// emptyDir); empty: in memory, lost with the process.
	SpoolDir string
	// SpoolBytes bounds the spool (default 64 MiB). A batch with no room is dropped
	// and counted.
	SpoolBytes int64
	// FlushInterval is how often the rollups are flushed (default 10s); negative:
	// only by Flush and Close. It bounds, with SpoolBytes, what a lost pod takes with it.
	FlushInterval time.Duration
	// MaxRows flushes early once this many rows are held (default 50,000), bounding
	// the memory between flushes.
	MaxRows int
	// WhenFull is the policy while the spool is full (default KeepServing); the
	// ledger reports it through Refusing and Refuse, and leaves refusing to the server.
	WhenFull FullPolicy
	// Logger logs failed flushes (default slog.Default()).
	Logger *slog.Logger
	// OnDrop, when set, is told of each batch dropped for want of room in the spool.
	OnDrop func(Dropped)
	// KeyRetention is how long the sink keeps each applied batch's idempotency key
	// (default 7 days; negative: forever). The ledger prunes older keys every
	// PruneEvery (default 1h), and sets aside, unreplayed, a spooled batch made
	// more than KeyRetention minus an hour ago: its key may be gone, so a replay could
	// count it twice. The hour covers the replicas' clocks and the pruning interval.
	KeyRetention time.Duration
	PruneEvery   time.Duration
	// Now is the clock of the spool's start epoch, of batches' creation and of
	// pruning (default time.Now).
	Now func() time.Time
}

// retentionMargin is what a spooled batch's age must stay under the key retention
// by to be replayed.
const retentionMargin = time.Hour

// Dropped is what a batch dropped for want of spool room held: its rows (the
// records of the rollup) and their sums.
type Dropped struct {
	Batches int64 `json:"batches"`
	Rows    int64 `json:"rows"`
	Sums
}

// add adds another's.
func (d *Dropped) add(o *Dropped) {
	d.Batches += o.Batches
	d.Rows += o.Rows
	d.Sums.add(&o.Sums)
}

// Stats are a ledger's counters since it started.
type Stats struct {
	// Replica is the identity in this ledger's idempotency keys.
	Replica string
	// Flushed counts batches the sink applied; Duplicates those it had applied
	// before (a retry or a replay), counted once.
	Flushed, Duplicates int64
	// SpoolBatches and SpoolBytes wait for the sink.
	SpoolBatches int
	SpoolBytes   int64
	// Corrupt counts spool files that could not be read at the start (set aside).
	Corrupt int
	// Dropped sums what could not be recorded; Expired the spooled batches set aside
	// unreplayed, older than the key retention allows (maybe applied before, maybe
	// not). Both are kept in the spool's directory: they count since the replica's
	// identity began, across restarts of its process.
	Dropped, Expired Dropped
	// Pruned counts the idempotency keys this ledger pruned.
	Pruned int64
	// Refused counts the requests refused because the spool was full (Refuse).
	Refused int64
	// Oldest is when the oldest spooled batch was made; zero with none.
	Oldest time.Time
	// FlushedThrough is the start of the last flush that left the spool empty: every
	// settlement added before it is in the sink. Zero before one.
	FlushedThrough time.Time
	// Full: the last batch found no room in the spool and the sink did not take it.
	Full bool
	// LastError is the last flush's error, nil once a flush succeeds.
	LastError error
}

// Ledger records settlements: Add sums them in memory per minute, and a flush hands
// the rows to the sink as a batch, through the spool, in sequence order.
//
// What a pod lost with its disk takes with it is bounded: the rows held in memory
// (at most FlushInterval of settlements, or MaxRows rows) and the spool (at most
// SpoolBytes). A process killed and restarted in the same pod loses only the rows in
// memory: it replays the spool under the same keys.
type Ledger struct {
	cfg   Config
	log   *slog.Logger
	mem   *rollups
	spool *spool

	flushMu sync.Mutex // one flush at a time
	// handMu guards hand, the batch a flush has taken from memory and not yet put in
	// the spool (or handed to the sink), so that Pending sees it somewhere.
	handMu    sync.Mutex
	hand      *Batch
	lastPrune time.Time // the loop's only
	kick      chan struct{}
	stop      chan struct{}
	done      chan struct{}
	closed    atomic.Bool

	mu      sync.Mutex
	stats   Stats
	full    atomic.Bool
	refused atomic.Int64
	lastErr error
}

// New starts a ledger: it opens the spool (taking the identity and the batches a
// process of the same pod left there) and, unless FlushInterval is negative, flushes
// in the background.
func New(cfg Config) (*Ledger, error) {
	if cfg.Sink == nil {
		return nil, errors.New("ledger: no sink")
	}
	if cfg.Pod == "" {
		cfg.Pod, _ = os.Hostname()
	}
	cfg.SpoolBytes = cmpOr(cfg.SpoolBytes, 64<<20)
	cfg.FlushInterval = cmpOr(cfg.FlushInterval, 10*time.Second)
	cfg.MaxRows = cmpOr(cfg.MaxRows, 50000)
	cfg.WhenFull = cmpOr(cfg.WhenFull, KeepServing)
	cfg.KeyRetention = cmpOr(cfg.KeyRetention, 7*24*time.Hour)
	cfg.PruneEvery = cmpOr(cfg.PruneEvery, time.Hour)
	if cfg.KeyRetention > 0 && cfg.KeyRetention <= retentionMargin {
		return nil, fmt.Errorf("ledger: a key retention of %s leaves no time to replay a spool (more than %s)", cfg.KeyRetention, retentionMargin)
	}
	if cfg.WhenFull != KeepServing && cfg.WhenFull != Refuse {
		return nil, fmt.Errorf("ledger: unknown policy %q for a full spool (keep-serving or refuse)", cfg.WhenFull)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	l := &Ledger{cfg: cfg, log: cfg.Logger, mem: newRollups(), kick: make(chan struct{}, 1),
		stop: make(chan struct{}), done: make(chan struct{})}
	if l.log == nil {
		l.log = slog.Default()
	}
	sp, err := openSpool(cfg.SpoolDir, cfg.Pod, cfg.SpoolBytes, cfg.Now())
	if err != nil {
		return nil, err
	}
	l.spool = sp
	if cfg.FlushInterval > 0 {
		go l.loop()
	} else {
		close(l.done)
	}
	return l, nil
}

func cmpOr[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}

// Add records one settlement. It never blocks on the sink or the disk: it adds to
// the minute's row in memory. After Close the settlement is counted as dropped.
func (l *Ledger) Add(r Record) {
	if l.closed.Load() {
		var s Sums
		s.addRecord(&r)
		l.dropped(Dropped{Rows: 1, Sums: s})
		return
	}
	if l.mem.add(&r) >= int64(l.cfg.MaxRows) {
		select {
		case l.kick <- struct{}{}:
		default:
		}
	}
}

// loop flushes every FlushInterval, and early when the rows reach MaxRows.
func (l *Ledger) loop() {
	defer close(l.done)
	t := time.NewTicker(l.cfg.FlushInterval)
	defer t.Stop()
	failing := false
	for {
		select {
		case <-l.stop:
			return
		case <-t.C:
		case <-l.kick:
		}
		ctx, cancel := context.WithTimeout(context.Background(), l.cfg.FlushInterval+10*time.Second)
		err := l.Flush(ctx)
		cancel()
		// Logged when it starts and when it ends, not at every flush.
		switch {
		case err != nil && !failing:
			n, bytes := l.spool.size()
			l.log.Warn("Ledger flush failed; the batches wait in the spool", "err", err, "replica", l.spool.replica, "batches", n, "bytes", bytes)
		case err == nil && failing:
			l.log.Info("Ledger flush recovered; the spool is replayed", "replica", l.spool.replica)
		}
		failing = err != nil
		if err == nil {
			l.maybePrune()
		}
	}
}

// maybePrune prunes the sink's idempotency keys older than the retention, at most
// once every PruneEvery; any replica may (a delete of what is already gone does
// nothing).
func (l *Ledger) maybePrune() {
	now := l.cfg.Now()
	if l.cfg.KeyRetention < 0 || now.Sub(l.lastPrune) < l.cfg.PruneEvery {
		return
	}
	l.lastPrune = now
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := l.Prune(ctx); err != nil {
		l.log.Warn("Ledger could not prune old idempotency keys", "err", err)
	}
}

// Prune deletes the sink's idempotency keys of batches applied more than
// KeyRetention ago, and returns how many.
func (l *Ledger) Prune(ctx context.Context) (int64, error) {
	n, err := l.cfg.Sink.Prune(ctx, l.cfg.Now().Add(-l.cfg.KeyRetention))
	if err != nil {
		return 0, err
	}
	l.mu.Lock()
	l.stats.Pruned += n
	l.mu.Unlock()
	return n, nil
}

// Flush hands the rows held to the sink as one batch and replays the spool in order:
// nil once the sink has every batch; otherwise they wait in the spool for the next.
func (l *Ledger) Flush(ctx context.Context) error {
	l.flushMu.Lock()
	defer l.flushMu.Unlock()
	start := l.cfg.Now()
	l.handMu.Lock()
	rows := l.mem.take()
	b := &Batch{Rows: rows, Created: start.Unix()}
	if len(rows) > 0 {
		l.hand = b
	}
	l.handMu.Unlock()
	if len(rows) > 0 {
		if err := l.spool.assign(b); err != nil {
			l.log.Warn("Ledger spool could not keep the sequence", "err", err)
		}
		err := l.keep(ctx, b)
		l.handMu.Lock()
		l.hand = nil
		l.handMu.Unlock()
		if err != nil {
			return l.failed(err)
		}
	}
	err := l.drain(ctx)
	if err == nil {
		l.mu.Lock()
		l.stats.FlushedThrough = start
		l.mu.Unlock()
	}
	return l.failed(err)
}

// keep puts b in the spool; with no room, it drains the spool first, then hands b to
// the sink itself, and drops it (counted) when the sink does not take it either.
func (l *Ledger) keep(ctx context.Context, b *Batch) error {
	ok, err := l.spool.push(b)
	if ok || err != nil {
		return err
	}
	drainErr := l.drain(ctx)
	if ok, err := l.spool.push(b); ok || err != nil {
		l.full.Store(false)
		return err
	}
	err = l.apply(ctx, b)
	if err == nil {
		return drainErr
	}
	l.full.Store(true)
	if l.cfg.WhenFull == Refuse && l.mem.rows.Load()+int64(len(b.Rows)) < int64(l.cfg.MaxRows) {
		// The requests it holds were served before the spool was full: they are kept
		// for the next flush, and what cost budgets govern is refused meanwhile. They
		// leave the hand as they return, so that Pending counts them once.
		l.handMu.Lock()
		l.mem.putBack(b.Rows)
		l.hand = nil
		l.handMu.Unlock()
		return fmt.Errorf("ledger: the spool is full (%d bytes): a batch of %d rows waits in memory: %w", l.cfg.SpoolBytes, len(b.Rows), err)
	}
	d := Dropped{Batches: 1, Rows: int64(len(b.Rows)), Sums: b.totals()}
	l.dropped(d)
	l.log.Warn("Ledger dropped a batch: the spool is full and the database does not take it; it is counted, never recorded",
		"replica", b.Replica, "seq", b.Seq, "rows", d.Rows, "requests", d.Requests, "cost_micro_usd", d.CostMicros,
		"dropped_cost_micro_usd_total", l.spool.unrecorded().Dropped.CostMicros)
	return fmt.Errorf("ledger: the spool is full (%d bytes): a batch of %d rows was dropped: %w", l.cfg.SpoolBytes, len(b.Rows), err)
}

// drain hands the spooled batches to the sink, oldest first, and stops at the first
// the sink does not take.
func (l *Ledger) drain(ctx context.Context) error {
	for b := l.spool.first(); b != nil; b = l.spool.first() {
		if l.expired(b) {
			l.expire(b)
			if err := l.spool.pop(); err != nil {
				return err
			}
			continue
		}
		if err := l.apply(ctx, b); err != nil {
			return err
		}
		if err := l.spool.pop(); err != nil {
			return err
		}
	}
	l.full.Store(false)
	return nil
}

// expired tells a batch made longer ago than the key retention allows a replay.
func (l *Ledger) expired(b *Batch) bool {
	return l.cfg.KeyRetention > 0 && b.Created > 0 &&
		l.cfg.Now().Sub(time.Unix(b.Created, 0)) > l.cfg.KeyRetention-retentionMargin
}

// expire counts a batch set aside unreplayed, and logs it.
func (l *Ledger) expire(b *Batch) {
	s := b.totals()
	if err := l.spool.lose(Dropped{Batches: 1, Rows: int64(len(b.Rows)), Sums: s}, true); err != nil {
		l.log.Warn("Ledger could not keep its count of what it could not record", "err", err)
	}
	l.log.Warn("Ledger set aside a spooled batch older than the key retention: a replay could count it twice",
		"replica", b.Replica, "seq", b.Seq, "created", time.Unix(b.Created, 0).UTC(), "rows", len(b.Rows), "cost_micro_usd", s.CostMicros)
}

// apply hands one batch to the sink and counts it.
func (l *Ledger) apply(ctx context.Context, b *Batch) error {
	applied, err := l.cfg.Sink.Apply(ctx, b)
	if err != nil {
		return fmt.Errorf("batch %s/%d: %w", b.Replica, b.Seq, err)
	}
	l.mu.Lock()
	if applied {
		l.stats.Flushed++
	} else {
		l.stats.Duplicates++
	}
	l.mu.Unlock()
	return nil
}

func (l *Ledger) failed(err error) error {
	l.mu.Lock()
	l.lastErr = err
	l.mu.Unlock()
	return err
}

// dropped counts what could not be recorded, in the spool's directory.
func (l *Ledger) dropped(d Dropped) {
	if err := l.spool.lose(d, false); err != nil {
		l.log.Warn("Ledger could not keep its count of what it could not record", "err", err)
	}
	if l.cfg.OnDrop != nil {
		l.cfg.OnDrop(d)
	}
}

// Full reports whether the spool is full: the last batch found no room and the sink
// did not take it. It clears once the spool drains.
func (l *Ledger) Full() bool { return l.full.Load() }

// Refusing reports whether the server should refuse the requests cost budgets govern:
// the spool is full and the policy is Refuse.
func (l *Ledger) Refusing() bool { return l.cfg.WhenFull == Refuse && l.Full() }

// Refuse is asked for a request that cost budgets govern: while Refusing it refuses
// it, counts it (Stats.Refused), and tells the client to retry after a flush
// interval, when the spool may drain.
func (l *Ledger) Refuse() (retryAfter time.Duration, refuse bool) {
	if !l.Refusing() {
		return 0, false
	}
	l.refused.Add(1)
	if l.cfg.FlushInterval > 0 {
		return l.cfg.FlushInterval, true
	}
	return 10 * time.Second, true
}

// Stats returns the ledger's counters.
func (l *Ledger) Stats() Stats {
	l.mu.Lock()
	st := l.stats
	st.LastError = l.lastErr
	l.mu.Unlock()
	st.Replica = l.spool.replica
	st.SpoolBatches, st.SpoolBytes = l.spool.size()
	st.Oldest = l.spool.oldest()
	st.Corrupt = l.spool.corrupt
	lost := l.spool.unrecorded()
	st.Dropped, st.Expired = lost.Dropped, lost.Expired
	st.Full = l.Full()
	st.Refused = l.refused.Load()
	return st
}

// Close stops the background flushes and flushes once more, the spool first (the
// drain on termination). It returns an error when batches remain spooled: a process
// of the same pod replays them. It does not close the sink.
func (l *Ledger) Close(ctx context.Context) error {
	if l.closed.Swap(true) {
		return nil
	}
	if l.cfg.FlushInterval > 0 {
		close(l.stop)
	}
	<-l.done
	err := l.Flush(ctx)
	// An Add that raced the close is counted, not kept.
	for _, r := range l.mem.take() {
		l.dropped(Dropped{Rows: 1, Sums: r.Sums})
	}
	if err != nil {
		n, bytes := l.spool.size()
		return fmt.Errorf("ledger: %d batches (%d bytes) remain in the spool: %w", n, bytes, err)
	}
	return nil
}
