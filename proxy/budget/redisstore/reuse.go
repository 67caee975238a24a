// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package redisstore

import (
	"slices"
	"sync"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
)

// An apply call's layout (its spec buffer and keys) and its batch sum live only while
// the pipeline that carries it is sent and answered: the decisions handed to callers
// are allocated apart (batchSum.decisions). So a pipeline returns them once it has
// answered every call, and the next one lays out its calls in the same memory instead
// of allocating a kilobyte or two of garbage per call.

// applyLayout is one apply call's spec and batch sum.
type applyLayout struct {
	spec spec
	sum  batchSum
	// sumArg is the sum's argument, laid out in sumBuf; termsArg the reservations in
	// the sum's terms, laid out in termsBuf.
	sumArg, termsArg specArg
	sumBuf, termsBuf []byte
}

// layouts holds the layouts of pipelines already answered.
var layouts = sync.Pool{New: func() any { return new(applyLayout) }}

// getLayout returns a layout ready for a call of that many buckets, of which reserved
// are the reservations'.
func getLayout(buckets, reserved int) *applyLayout {
	l := layouts.Get().(*applyLayout)
	l.spec.reset(buckets)
	l.sum.reset(reserved)
	l.sum.layout = l
	return l
}

// release returns the layout of an answered call for the next pipeline.
func (b *batchSum) release() {
	if l := b.layout; l != nil {
		layouts.Put(l)
	}
}

// reset empties p for a call of that many buckets.
func (p *spec) reset(buckets int) {
	p.ids = slices.Grow(p.ids[:0], min(buckets, int(budget.NumDimensions)))
	clear(p.keys)
	p.keys = slices.Grow(p.keys[:0], min(buckets, int(budget.NumDimensions)))
	p.byID = nil
	p.buf = slices.Grow(p.buf[:0], buckets*specSize)
}

// reset empties b for a call of that many reserved buckets.
func (b *batchSum) reset(buckets int) {
	distinct := min(buckets, 64)
	if len(b.at) < 4*(distinct+1) {
		b.at = make([]int, 4*(distinct+1))
	} else {
		clear(b.at)
	}
	b.idx = slices.Grow(b.idx[:0], buckets)
	b.buckets = slices.Grow(b.buckets[:0], distinct)
	b.seen = slices.Grow(b.seen[:0], distinct)
	b.off, b.reservations = false, 0
}
