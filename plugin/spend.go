// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package plugin

import (
	"context"
	"fmt"
	"io"
	"net/url"
	"strconv"
	"time"

	"github.com/spf13/cobra"
)

// spendOptions are the flags of `spend`.
type spendOptions struct {
	*Options
	out      *outputFlags
	replicas replicaFlags
	by       string
	since    time.Duration
	from, to string
}

// spendDimensions are what --by takes, and the ledger's name of each.
var spendDimensions = map[string]string{"tenant": "tenant", "team": "team", "key": "api_key", "user": "user", "model": "model"}

func newSpendCommand(o *Options) *cobra.Command {
	s := &spendOptions{Options: o, out: newOutputFlags()}
	cmd := &cobra.Command{
		Use:   "spend --by tenant|team|key|user|model [--since 24h | --from T --to T]",
		Short: "What was spent, from the spend ledger, by tenant, team, key, user or model",
		Long: `spend asks one replica of the fleet for the spend ledger's report (GET /admin/ledger/report on its
admin port): requests, tokens and US dollars by the dimension given, over the last --since (24h) or
from --from to --to (RFC 3339, or a date). Under a PostgreSQL ledger every replica reports the fleet's
whole record; a SQLite ledger is one replica's own. -o csv prints the ledger's CSV.

It reaches the replicas as why does (port-forward with your credentials, or --admin-addr). A caller who
may not read the whole report is shown the spend of the tenant namespaces where it may get
tokenbudgets (the platform's own keys' with the fleet's namespace).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return s.run(cmd.Context())
		},
	}
	s.out.addFlags(cmd)
	cmd.Flags().Lookup("output").Usage = "Output format: wide, csv, or one of " + fmt.Sprint(s.out.print.AllowedFormats()) + "."
	s.replicas.addFlags(cmd)
	cmd.Flags().StringVar(&s.by, "by", "team", "Group by tenant, team, key, user or model.")
	cmd.Flags().DurationVar(&s.since, "since", 24*time.Hour, "The report covers this long before now (or before --to).")
	cmd.Flags().StringVar(&s.from, "from", "", "The report's start (RFC 3339, or a date in UTC); replaces --since.")
	cmd.Flags().StringVar(&s.to, "to", "", "The report's end (default: now).")
	return cmd
}

// SpendReport is the ledger's report as spend prints it.
type SpendReport struct {
	From    time.Time  `json:"from"`
	To      time.Time  `json:"to"`
	GroupBy []string   `json:"group_by"`
	Rows    []SpendRow `json:"rows"`
	Total   SpendRow   `json:"total"`
}

// SpendRow is one group's sums.
type SpendRow struct {
	Group        map[string]string `json:"group"`
	Requests     int64             `json:"requests"`
	InputTokens  int64             `json:"input_tokens"`
	OutputTokens int64             `json:"output_tokens"`
	CachedTokens int64             `json:"cached_tokens"`
	CostUSD      string            `json:"cost_usd"`
	CacheHits    int64             `json:"cache_hits"`
	SavedUSD     string            `json:"saved_usd"`
}

// query is the report's parameters.
func (s *spendOptions) query(format string) (url.Values, error) {
	dim, ok := spendDimensions[s.by]
	if !ok {
		return nil, fmt.Errorf("--by: want tenant, team, key, user or model, got %q", s.by)
	}
	q := url.Values{"group_by": {dim}, "format": {format}}
	to := s.Now().UTC()
	if s.to != "" {
		q.Set("to", s.to)
	} else {
		q.Set("to", to.Format(time.RFC3339))
	}
	switch {
	case s.from != "":
		q.Set("from", s.from)
	case s.to == "":
		q.Set("from", to.Add(-s.since).Format(time.RFC3339))
	default:
		t, err := time.Parse(time.RFC3339, s.to)
		if err != nil {
			return nil, fmt.Errorf("--to with --since: want RFC 3339, got %q", s.to)
		}
		q.Set("from", t.Add(-s.since).UTC().Format(time.RFC3339))
	}
	return q, nil
}

func (s *spendOptions) run(ctx context.Context) error {
	csv := s.out.format() == "csv"
	format := "json"
	if csv {
		format = "csv"
	}
	q, err := s.query(format)
	if err != nil {
		return err
	}
	ns, err := s.namespace()
	if err != nil {
		return err
	}
	a, err := s.connect(ctx, &s.replicas, ns)
	if err != nil {
		return err
	}
	defer a.Close()
	// One replica answers for the ledger: the first that does.
	var last error
	for _, r := range a.replica {
		if csv {
			var body []byte
			if body, last = a.getRaw(ctx, r, "/admin/ledger/report", q); last == nil {
				_, err := s.Streams.Out.Write(body)
				return err
			}
		} else {
			var rep SpendReport
			if last = a.get(ctx, r, "/admin/ledger/report", q, &rep); last == nil {
				return s.print(&rep, spendDimensions[s.by])
			}
		}
		if refusedErr(last) {
			return last
		}
		fmt.Fprintf(s.Streams.ErrOut, "warning: %v\n", last)
	}
	return last
}

// print prints the report: a table of the groups and their total, or -o's printer.
func (s *spendOptions) print(rep *SpendReport, dim string) error {
	if !s.out.table() {
		return s.out.printRows(s.Streams.Out, rep.Rows)
	}
	return s.printTable(s.Streams.Out, rep, dim)
}

func (s *spendOptions) printTable(w io.Writer, rep *SpendReport, dim string) error {
	header := []string{upper(s.by), "REQUESTS", "INPUT", "OUTPUT", "CACHED", "COST USD"}
	if s.out.wide() {
		header = append(header, "CACHE HITS", "SAVED USD")
	}
	row := func(name string, r *SpendRow) []string {
		cells := []string{name, strconv.FormatInt(r.Requests, 10), strconv.FormatInt(r.InputTokens, 10), strconv.FormatInt(r.OutputTokens, 10),
			strconv.FormatInt(r.CachedTokens, 10), r.CostUSD}
		if s.out.wide() {
			cells = append(cells, strconv.FormatInt(r.CacheHits, 10), r.SavedUSD)
		}
		return cells
	}
	var rows [][]string
	for i := range rep.Rows {
		rows = append(rows, row(dash(rep.Rows[i].Group[dim]), &rep.Rows[i]))
	}
	rows = append(rows, row("TOTAL", &rep.Total))
	fmt.Fprintf(w, "Spend from %s to %s.\n", rep.From.UTC().Format(time.RFC3339), rep.To.UTC().Format(time.RFC3339))
	return printTable(w, header, rows)
}

// upper is a column title.
func upper(s string) string {
	b := []byte(s)
	for i, c := range b {
		if c >= 'a' && c <= 'z' {
			b[i] = c - 'a' + 'A'
		}
	}
	return string(b)
}
