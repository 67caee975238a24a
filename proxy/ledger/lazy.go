// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package ledger

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// Lazy is a Sink on a database that may not answer yet: it opens (and migrates) it
// on first use, and again after a failed open at most every Retry, so that a proxy
// starts and serves while its ledger database is down, its batches waiting in the
// spool meanwhile.
type Lazy struct {
	URL string
	// Retry is the shortest time between two opens (default 5s).
	Retry time.Duration

	mu     sync.Mutex
	sink   *SQLSink
	last   time.Time
	err    error
	closed bool
}

// errClosed is the error of a closed Lazy.
var errClosed = errors.New("ledger: closed")

// Open returns the sink, opening it if it is not yet.
func (z *Lazy) Open(ctx context.Context) (*SQLSink, error) {
	z.mu.Lock()
	defer z.mu.Unlock()
	switch {
	case z.closed:
		return nil, errClosed
	case z.sink != nil:
		return z.sink, nil
	case z.err != nil && time.Since(z.last) < cmpOr(z.Retry, 5*time.Second):
		return nil, fmt.Errorf("ledger: not open: %w", z.err)
	}
	z.last = time.Now()
	z.sink, z.err = Open(ctx, z.URL)
	if z.err != nil {
		return nil, z.err
	}
	return z.sink, nil
}

// Apply implements Sink.
func (z *Lazy) Apply(ctx context.Context, b *Batch) (bool, error) {
	s, err := z.Open(ctx)
	if err != nil {
		return false, err
	}
	return s.Apply(ctx, b)
}

// Prune implements Sink.
func (z *Lazy) Prune(ctx context.Context, before time.Time) (int64, error) {
	s, err := z.Open(ctx)
	if err != nil {
		return 0, err
	}
	return s.Prune(ctx, before)
}

// Report implements Sink.
func (z *Lazy) Report(ctx context.Context, q Query) ([]ReportRow, error) {
	s, err := z.Open(ctx)
	if err != nil {
		return nil, err
	}
	return s.Report(ctx, q)
}

// Close implements Sink.
func (z *Lazy) Close() error {
	z.mu.Lock()
	defer z.mu.Unlock()
	z.closed = true
	if z.sink == nil {
		return nil
	}
	return z.sink.Close()
}
