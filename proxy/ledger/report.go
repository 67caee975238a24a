// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package ledger

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"
)

// Dimension is what a report groups or filters by.
type Dimension string

// The dimensions a settlement is recorded by.
const (
	Fleet    Dimension = "fleet"
	Tenant   Dimension = "tenant"
	APIKey   Dimension = "api_key"
	User     Dimension = "user"
	Team     Dimension = "team"
	Model    Dimension = "model"
	Upstream Dimension = "upstream"
)

// Dimensions lists every dimension.
var Dimensions = []Dimension{Fleet, Tenant, APIKey, User, Team, Model, Upstream}

// column is the dimension's column in ledger_rollups.
func (d Dimension) column() (string, bool) {
	switch d {
	case Fleet, Tenant, APIKey, Team, Model, Upstream:
		return string(d), true
	case User:
		return "user_name", true
	}
	return "", false
}

// Of is the dimension's value in dims.
func (d Dimension) Of(dims *Dims) string {
	switch d {
	case Fleet:
		return dims.Fleet
	case Tenant:
		return dims.Tenant
	case APIKey:
		return dims.APIKey
	case User:
		return dims.User
	case Team:
		return dims.Team
	case Model:
		return dims.Model
	case Upstream:
		return dims.Upstream
	}
	return ""
}

// Bucket is the time a report's rows each cover.
type Bucket string

// The buckets: the whole range, an hour or a day (UTC).
const (
	Whole Bucket = ""
	Hour  Bucket = "hour"
	Day   Bucket = "day"
)

// seconds is the bucket's length; 0 for the whole range.
func (b Bucket) seconds() (int64, bool) {
	switch b {
	case Whole:
		return 0, true
	case Hour:
		return 3600, true
	case Day:
		return 86400, true
	}
	return 0, false
}

// Query selects and groups rollups for a report.
type Query struct {
	// From and To are the range: the minutes that start in [From, To).
	From, To time.Time
	// GroupBy are the dimensions of a row, in order; none: one row for the range.
	GroupBy []Dimension
	// Bucket splits the range into hours or days (UTC).
	Bucket Bucket
	// Where keeps only the rollups with these values (one tenant's, for a tenant's
	// reader).
	Where map[Dimension]string
}

// ReportRow is one group's sums over one bucket.
type ReportRow struct {
	// Start and End are the part of the range the row covers.
	Start, End time.Time
	// Group holds the value of each dimension grouped by.
	Group map[Dimension]string
	Sums
}

// validate checks the query's names (every one becomes a column name in SQL).
func (q *Query) validate() error {
	if !q.From.Before(q.To) {
		return fmt.Errorf("ledger: the report's range is empty: from %s to %s", q.From.Format(time.RFC3339), q.To.Format(time.RFC3339))
	}
	if _, ok := q.Bucket.seconds(); !ok {
		return fmt.Errorf("ledger: no bucket %q (hour or day)", q.Bucket)
	}
	seen := map[Dimension]bool{}
	for _, d := range q.GroupBy {
		if _, ok := d.column(); !ok || seen[d] {
			return fmt.Errorf("ledger: cannot group by %q (one each of %v)", d, Dimensions)
		}
		seen[d] = true
	}
	for d := range q.Where {
		if _, ok := d.column(); !ok {
			return fmt.Errorf("ledger: cannot filter by %q (one of %v)", d, Dimensions)
		}
	}
	return nil
}

// Report sums the rollups the query selects, in SQL: one row per bucket and group,
// ordered by time, then by the groups' values.
func (s *SQLSink) Report(ctx context.Context, q Query) ([]ReportRow, error) {
	if err := q.validate(); err != nil {
		return nil, err
	}
	stmt, args := s.reportSQL(&q)
	rs, err := s.db.QueryContext(ctx, stmt, args...)
	if err != nil {
		return nil, fmt.Errorf("ledger: report: %w", err)
	}
	defer func() { _ = rs.Close() }()
	size, _ := q.Bucket.seconds()
	var out []ReportRow
	for rs.Next() {
		var period int64
		vals := make([]string, len(q.GroupBy))
		dest := []any{&period}
		for i := range vals {
			dest = append(dest, &vals[i])
		}
		var r ReportRow
		dest = append(dest, &r.Requests, &r.InputTokens, &r.OutputTokens, &r.CachedTokens, &r.CostMicros,
			&r.CacheHits, &r.SavedInput, &r.SavedOutput, &r.SavedMicros)
		if err := rs.Scan(dest...); err != nil {
			return nil, fmt.Errorf("ledger: report: %w", err)
		}
		if r.Sums == (Sums{}) {
			continue // the whole range of nothing
		}
		r.Start, r.End = q.From, q.To
		if size > 0 {
			r.Start = maxTime(time.Unix(period, 0).UTC(), q.From)
			r.End = minTime(time.Unix(period+size, 0).UTC(), q.To)
		}
		r.Group = make(map[Dimension]string, len(q.GroupBy))
		for i, d := range q.GroupBy {
			r.Group[d] = vals[i]
		}
		out = append(out, r)
	}
	if err := rs.Err(); err != nil {
		return nil, fmt.Errorf("ledger: report: %w", err)
	}
	// In Go, not SQL: the database's collation must not decide the order.
	slices.SortFunc(out, func(a, b ReportRow) int {
		if c := a.Start.Compare(b.Start); c != 0 {
			return c
		}
		for _, d := range q.GroupBy {
			if c := cmp.Compare(a.Group[d], b.Group[d]); c != 0 {
				return c
			}
		}
		return 0
	})
	return out, nil
}

// reportSQL is the query's statement and arguments.
func (s *SQLSink) reportSQL(q *Query) (string, []any) {
	size, _ := q.Bucket.seconds()
	args := []any{q.From.Unix(), q.To.Unix()} // the minutes that start in the range
	period := "CAST(0 AS BIGINT)"
	if size > 0 {
		period = fmt.Sprintf("CAST((minute / %d) * %d AS BIGINT)", size, size)
	}
	var cols []string
	for _, d := range q.GroupBy {
		c, _ := d.column()
		cols = append(cols, c)
	}
	sel := append([]string{period + " AS period"}, cols...)
	for _, c := range sumColumns {
		sel = append(sel, "CAST(COALESCE(SUM("+c+"), 0) AS BIGINT)")
	}
	var b strings.Builder
	fmt.Fprintf(&b, "SELECT %s FROM ledger_rollups WHERE minute >= %s AND minute < %s",
		strings.Join(sel, ", "), s.d.param(1), s.d.param(2))
	for _, d := range Dimensions { // a fixed order, whatever the map's
		if v, ok := q.Where[d]; ok {
			c, _ := d.column()
			args = append(args, v)
			fmt.Fprintf(&b, " AND %s = %s", c, s.d.param(len(args)))
		}
	}
	group := slices.Clone(cols)
	if size > 0 {
		group = append([]string{"period"}, group...)
	}
	if len(group) > 0 {
		b.WriteString(" GROUP BY " + strings.Join(group, ", "))
	}
	return b.String(), args
}

// minuteOf is the start of t's minute in Unix seconds.
func minuteOf(t time.Time) int64 {
	sec := t.Unix()
	return sec - (sec%60+60)%60
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}
