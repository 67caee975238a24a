// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package ledger

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// ReportPath is where the admin listener serves spend reports.
const ReportPath = "/admin/ledger/report"

// MaxReportRange bounds a report's range (a year and a day), and with it what one
// request makes the database read.
const MaxReportRange = 366 * 24 * time.Hour

// ReportHandler serves spend reports from a sink (docs/ledger.md, "Reports"):
//
//	GET /admin/ledger/report?from=2026-11-01T00:00:00Z&to=2026-12-01T00:00:00Z
//	    &group_by=team,model&bucket=day&format=json|csv|focus&tenant=team-a
//
// from and to are RFC 3339 or a date (UTC); to defaults to now and from to 24 hours
// before to. group_by lists dimensions (fleet, tenant, api_key, user, team, model,
// upstream); bucket is hour or day (absent: the whole range); every dimension may
// also be a filter (tenant=team-a). It answers 400 naming a bad parameter, and 503
// while the database does not answer. Authentication is the admin listener's; a
// caller it scopes to some tenants reads only their spend (403 for a tenant filter it
// may not read).
type ReportHandler struct {
	Sink Sink
	// Now is the clock of the default range (default time.Now).
	Now func() time.Time
}

// ServeHTTP implements http.Handler.
func (h *ReportHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "a report is read with GET", http.StatusMethodNotAllowed)
		return
	}
	now := time.Now
	if h.Now != nil {
		now = h.Now
	}
	q, format, err := parseReport(r.URL.Query(), now())
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	rows, err := h.report(r.Context(), q)
	var forbidden *forbiddenTenant
	if errors.As(err, &forbidden) {
		http.Error(w, err.Error(), http.StatusForbidden)
		return
	}
	if err != nil {
		w.Header().Set("Retry-After", "5")
		http.Error(w, "the ledger database does not answer: "+err.Error(), http.StatusServiceUnavailable)
		return
	}
	name := fmt.Sprintf("spend-%s-%s", q.From.Format("20060102T1504Z"), q.To.Format("20060102T1504Z"))
	switch format {
	case "csv", "focus":
		w.Header().Set("Content-Type", "text/csv; charset=utf-8")
		if format == "focus" {
			name += "-focus"
		}
		w.Header().Set("Content-Disposition", `attachment; filename="`+name+`.csv"`)
	default:
		w.Header().Set("Content-Type", "application/json")
	}
	if r.Method == http.MethodHead {
		return
	}
	switch format {
	case "csv":
		err = WriteCSV(w, q, rows)
	case "focus":
		err = WriteFOCUS(w, q, rows)
	default:
		err = WriteJSON(w, q, rows)
	}
	_ = err // the answer has begun: nothing left to tell the client
}

// parseReport reads a report's parameters.
func parseReport(v url.Values, now time.Time) (Query, string, error) {
	var q Query
	for name := range v {
		if !knownParam(name) {
			return q, "", fmt.Errorf("unknown parameter %q (from, to, group_by, bucket, format, or a dimension: %v)", name, Dimensions)
		}
	}
	var err error
	q.To = now.UTC().Truncate(time.Minute).Add(time.Minute)
	if s := v.Get("to"); s != "" {
		if q.To, err = parseTime(s); err != nil {
			return q, "", fmt.Errorf("to: %w", err)
		}
	}
	q.From = q.To.Add(-24 * time.Hour)
	if s := v.Get("from"); s != "" {
		if q.From, err = parseTime(s); err != nil {
			return q, "", fmt.Errorf("from: %w", err)
		}
	}
	if q.To.Sub(q.From) > MaxReportRange {
		return q, "", fmt.Errorf("the range is longer than %d days", int(MaxReportRange.Hours()/24))
	}
	if s := v.Get("group_by"); s != "" {
		for _, d := range strings.Split(s, ",") {
			q.GroupBy = append(q.GroupBy, Dimension(strings.TrimSpace(d)))
		}
	}
	q.Bucket = Bucket(v.Get("bucket"))
	for _, d := range Dimensions {
		if vals, ok := v[string(d)]; ok {
			if q.Where == nil {
				q.Where = map[Dimension]string{}
			}
			q.Where[d] = vals[0]
		}
	}
	if err := q.validate(); err != nil {
		return q, "", err
	}
	format := v.Get("format")
	switch format {
	case "", "json", "csv", "focus":
	default:
		return q, "", fmt.Errorf("format: want json, csv or focus, got %q", format)
	}
	return q, format, nil
}

func knownParam(name string) bool {
	switch name {
	case "from", "to", "group_by", "bucket", "format":
		return true
	}
	_, ok := Dimension(name).column()
	return ok
}

// parseTime reads RFC 3339 or a date (its midnight, UTC).
func parseTime(s string) (time.Time, error) {
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		return t.UTC(), nil
	}
	t, err := time.Parse(time.DateOnly, s)
	if err != nil {
		return time.Time{}, fmt.Errorf("want RFC 3339 (2026-11-01T14:00:00Z) or a date (2026-11-01), got %q", s)
	}
	return t, nil
}
