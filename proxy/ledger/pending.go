// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package ledger

import (
	"context"
	"strings"
)

// Pending sums, as a report of the whole range does, the settlements this replica
// holds that the sink may not have yet: the rows in memory, the batch a flush is
// putting in the spool, and the spooled batches. A batch the sink has taken while the
// spool still holds it counts too: Pending never says less than is missing from the
// sink. Read it before the sink's report, so that a batch moving between the two
// counts at least once. Each settlement counts once: a flush moves rows from memory
// to its hand and from its hand to the spool, and Pending reads all three under the
// hand's lock, the hand only when the spool does not hold it.
func (l *Ledger) Pending(_ context.Context, q Query) ([]ReportRow, error) {
	if err := q.validate(); err != nil {
		return nil, err
	}
	g := grouper{q: &q, idx: map[string]int{}}
	l.handMu.Lock()
	defer l.handMu.Unlock()
	l.mem.each(g.add)
	// A flush puts its hand in the spool without the hand's lock: the spool says, in
	// the one look, whether it holds the hand yet.
	if hand := l.hand; !l.spool.each(hand, g.add) && hand != nil {
		for i := range hand.Rows {
			g.add(&hand.Rows[i])
		}
	}
	return g.rows, nil
}

// grouper sums rows into a query's groups.
type grouper struct {
	q    *Query
	idx  map[string]int
	rows []ReportRow
}

func (g *grouper) add(r *Row) {
	if r.Minute < g.q.From.Unix() || r.Minute >= g.q.To.Unix() {
		return
	}
	for d, v := range g.q.Where {
		if d.Of(&r.Dims) != v {
			return
		}
	}
	parts := make([]string, len(g.q.GroupBy))
	for i, d := range g.q.GroupBy {
		parts[i] = d.Of(&r.Dims)
	}
	k := strings.Join(parts, "\x00")
	i, ok := g.idx[k]
	if !ok {
		i = len(g.rows)
		g.idx[k] = i
		group := make(map[Dimension]string, len(g.q.GroupBy))
		for j, d := range g.q.GroupBy {
			group[d] = parts[j]
		}
		g.rows = append(g.rows, ReportRow{Start: g.q.From, End: g.q.To, Group: group})
	}
	g.rows[i].add(&r.Sums)
}

// each calls fn with every row held, under its shard's lock.
func (r *rollups) each(fn func(*Row)) {
	for i := range r.shard {
		sh := &r.shard[i]
		sh.mu.Lock()
		for k, s := range sh.m {
			fn(&Row{Minute: k.minute, Dims: k.Dims, Sums: *s})
		}
		sh.mu.Unlock()
	}
}

// each calls fn with every row of every batch waiting, and reports whether b is one
// of them.
func (s *spool) each(b *Batch, fn func(*Row)) (holds bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, p := range s.pending {
		holds = holds || p.b == b
		for i := range p.b.Rows {
			fn(&p.b.Rows[i])
		}
	}
	return holds
}
