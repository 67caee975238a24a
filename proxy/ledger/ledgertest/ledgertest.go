// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

// Package ledgertest is the behaviour suite every ledger sink must pass: the
// PostgreSQL sink and the SQLite sink run the same specs.
package ledgertest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/proxy/config"
	"github.com/tokenwarden/tokenwarden/proxy/ledger"
)

// Backend makes the databases a suite runs on.
type Backend struct {
	// NewURL is the URL of a new, empty database.
	NewURL func() string
}

// Base is the instant the specs' settlements start at.
var Base = time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)

// Outage is a sink the specs can make unreachable: while Down, Apply fails without
// reaching the database; while LoseAnswers, Apply reaches it and the answer is lost
// (the batch is applied, the ledger sees an error), as when a connection breaks
// between the commit and its acknowledgement.
type Outage struct {
	ledger.Sink
	Down, LoseAnswers atomic.Bool
	Calls             atomic.Int64
}

// ErrDown is the error of a sink that is down.
var ErrDown = errors.New("the ledger database is unreachable")

// Apply implements ledger.Sink.
func (o *Outage) Apply(ctx context.Context, b *ledger.Batch) (bool, error) {
	o.Calls.Add(1)
	if o.Down.Load() {
		return false, ErrDown
	}
	applied, err := o.Sink.Apply(ctx, b)
	if err == nil && o.LoseAnswers.Load() {
		return false, fmt.Errorf("the answer to a commit was lost: %w", ErrDown)
	}
	return applied, err
}

// Prices are the prices the specs' settlements are charged at, by budget.Policy.
var Prices = budget.NewPolicy(&config.Config{Models: []config.Model{
	{Name: "gpt-4o", Price: &config.Price{Input: 2.5, Output: 10, CachedInput: ptr(1.25)}},
	{Name: "gpt-4o-mini", Price: &config.Price{Input: 0.15, Output: 0.6}},
	{Name: "claude-sonnet", Price: &config.Price{Input: 3, Output: 15, CachedInput: ptr(0.3)}},
}})

func ptr[T any](v T) *T { return &v }

var (
	tenants   = []string{"team-a-ns", "team-b-ns"}
	keys      = []string{"ci", "app", "notebook", "batch", "agent"}
	users     = []string{"ana", "bo", "cy"}
	teams     = []string{"search", "ads"}
	models    = []string{"gpt-4o", "gpt-4o-mini", "claude-sonnet"}
	upstreams = []string{"openai", "azure", "anthropic"}
)

// Settlement is the i-th settlement of writer w: its dims, usage and time (spread
// over three hours and a day boundary) follow from (w, i), priced by Prices.
func Settlement(w, i int) ledger.Record {
	n := w*7919 + i
	model := models[n%len(models)]
	u := budget.Used{Input: int64(100 + n%977), Output: int64(10 + n%331)}
	u.Cached = u.Input * int64(n%3) / 4
	cost, _ := Prices.CostMicros(model, u)
	r := ledger.Record{
		Time: Base.Add(-time.Hour).Add(time.Duration(n%(180*60)) * time.Second).Add(time.Duration(n%997) * time.Millisecond),
		Dims: ledger.Dims{
			Fleet: "platform", Tenant: tenants[n%len(tenants)], APIKey: keys[n%len(keys)], User: users[n%len(users)],
			Team: teams[(n/3)%len(teams)], Model: model, Upstream: upstreams[(n/5)%len(upstreams)],
		},
		Used: u, CostMicros: cost,
	}
	if n%11 == 0 {
		r.CacheHit, r.Saved, r.SavedMicros = true, u, cost
		r.Used, r.CostMicros = budget.Used{}, 0
	}
	return r
}

// Expected sums records as a report of q would, in Go.
func Expected(q ledger.Query, records []ledger.Record) map[string]ledger.Sums {
	out := map[string]ledger.Sums{}
	for i := range records {
		r := &records[i]
		if m := r.Time.Truncate(time.Minute); m.Before(q.From) || !m.Before(q.To) {
			continue // a report has the minutes that start in its range
		}
		k := groupKey(q, bucketStart(q, r.Time), func(d ledger.Dimension) string { return d.Of(&r.Dims) })
		s := out[k]
		s.Requests++
		s.InputTokens += r.Used.Input
		s.OutputTokens += r.Used.Output
		s.CachedTokens += r.Used.Cached
		s.CostMicros += r.CostMicros
		if r.CacheHit {
			s.CacheHits++
		}
		s.SavedInput += r.Saved.Input
		s.SavedOutput += r.Saved.Output
		s.SavedMicros += r.SavedMicros
		out[k] = s
	}
	return out
}

// Got keys a report's rows as Expected does.
func Got(q ledger.Query, rows []ledger.ReportRow) map[string]ledger.Sums {
	out := map[string]ledger.Sums{}
	for _, r := range rows {
		k := groupKey(q, r.Start, func(d ledger.Dimension) string { return r.Group[d] })
		Expect(out).NotTo(HaveKey(k), "two rows of one bucket and group")
		out[k] = r.Sums
	}
	return out
}

func bucketStart(q ledger.Query, t time.Time) time.Time {
	var start time.Time
	switch q.Bucket {
	case ledger.Hour:
		start = t.Truncate(time.Hour)
	case ledger.Day:
		start = t.Truncate(24 * time.Hour)
	default:
		return q.From
	}
	if start.Before(q.From) {
		return q.From
	}
	return start
}

func groupKey(q ledger.Query, start time.Time, value func(ledger.Dimension) string) string {
	k := start.UTC().Format(time.RFC3339)
	for _, d := range q.GroupBy {
		k += "|" + string(d) + "=" + value(d)
	}
	return k
}

// Total sums every record.
func Total(records []ledger.Record) ledger.Sums {
	return Expected(ledger.Query{From: Base.Add(-48 * time.Hour), To: Base.Add(48 * time.Hour)}, records)[Base.Add(-48*time.Hour).Format(time.RFC3339)]
}

// All is a query of every settlement the specs make.
func All() ledger.Query {
	return ledger.Query{From: Base.Add(-48 * time.Hour), To: Base.Add(48 * time.Hour)}
}

// ReportTotal is the ledger's sum of every settlement.
func ReportTotal(ctx context.Context, s ledger.Sink) ledger.Sums {
	rows, err := s.Report(ctx, All())
	ExpectWithOffset(1, err).NotTo(HaveOccurred())
	if len(rows) == 0 {
		return ledger.Sums{}
	}
	ExpectWithOffset(1, rows).To(HaveLen(1))
	return rows[0].Sums
}

// AddConcurrently adds writers×each settlements from writers goroutines, and returns
// them.
func AddConcurrently(l *ledger.Ledger, writers, each int) []ledger.Record {
	var wg sync.WaitGroup
	out := make([][]ledger.Record, writers)
	for w := range writers {
		wg.Go(func() {
			for i := range each {
				r := Settlement(w, i)
				l.Add(r)
				out[w] = append(out[w], r)
			}
		})
	}
	wg.Wait()
	var all []ledger.Record
	for _, rs := range out {
		all = append(all, rs...)
	}
	return all
}

// DescribeSink runs the suite on a backend.
func DescribeSink(name string, b Backend) bool {
	return Describe("the ledger on "+name, func() {
		var (
			ctx  context.Context
			sink *ledger.SQLSink
			url  string
		)
		BeforeEach(func() {
			ctx = context.Background()
			url = b.NewURL()
			var err error
			sink, err = ledger.Open(ctx, url)
			Expect(err).NotTo(HaveOccurred())
			DeferCleanup(sink.Close)
		})
		newLedger := func(s ledger.Sink, mod func(*ledger.Config)) *ledger.Ledger {
			cfg := ledger.Config{Sink: s, Pod: "proxy-0", FlushInterval: -1}
			if mod != nil {
				mod(&cfg)
			}
			l, err := ledger.New(cfg)
			Expect(err).NotTo(HaveOccurred())
			return l
		}

		It("migrates an empty database to the current schema", func() {
			Expect(sink.Version(ctx)).To(Equal(int64(ledger.SchemaVersion)))
			Expect(ReportTotal(ctx, sink)).To(Equal(ledger.Sums{}))
		})

		It("migrates from every earlier schema, the previous one included, keeping its rows and reporting them by tenant", func() {
			for version := int64(1); version < ledger.SchemaVersion; version++ {
				oldURL := b.NewURL()
				old, err := ledger.OpenVersion(ctx, oldURL, version)
				Expect(err).NotTo(HaveOccurred())
				Expect(old.Version(ctx)).To(Equal(version))
				_, err = old.DB().ExecContext(ctx, `INSERT INTO ledger_rollups (minute, fleet, tenant, api_key, user_name, team, model, upstream,
					requests, input_tokens, output_tokens, cached_tokens, cost_micro_usd) VALUES
					(1793534400, 'platform', 'team-a-ns', 'team-a-ns_ci', 'ana', 'search', 'gpt-4o', 'openai', 3, 300, 30, 0, 1050),
					(1793534460, 'platform', '', 'ops_admin', 'bo', 'ops', 'gpt-4o', 'openai', 1, 100, 10, 20, 350)`)
				Expect(err).NotTo(HaveOccurred())
				Expect(old.Close()).To(Succeed())

				upgraded, err := ledger.Open(ctx, oldURL)
				Expect(err).NotTo(HaveOccurred())
				Expect(upgraded.Version(ctx)).To(Equal(int64(ledger.SchemaVersion)), "from version %d", version)
				Expect(ReportTotal(ctx, upgraded)).To(Equal(ledger.Sums{Requests: 4, InputTokens: 400, OutputTokens: 40, CachedTokens: 20, CostMicros: 1400}))
				q := ledger.Query{From: All().From, To: All().To, GroupBy: []ledger.Dimension{ledger.Tenant}}
				rows, err := upgraded.Report(ctx, q)
				Expect(err).NotTo(HaveOccurred())
				Expect(rows).To(HaveLen(2))
				Expect(rows[0].Group[ledger.Tenant]).To(Equal(""))
				Expect(rows[0].Sums).To(Equal(ledger.Sums{Requests: 1, InputTokens: 100, OutputTokens: 10, CachedTokens: 20, CostMicros: 350}))
				Expect(rows[1].Group[ledger.Tenant]).To(Equal("team-a-ns"))
				Expect(rows[1].Requests).To(Equal(int64(3)))
				// The upgraded database takes new batches on top of the old rows.
				Expect(upgraded.Apply(ctx, &ledger.Batch{Replica: "proxy-0@1", Seq: 1, Rows: []ledger.Row{{Minute: 1793534400,
					Dims: ledger.Dims{Fleet: "platform", Tenant: "team-a-ns", APIKey: "team-a-ns_ci", User: "ana", Team: "search", Model: "gpt-4o", Upstream: "openai"},
					Sums: ledger.Sums{Requests: 1, CacheHits: 1, SavedInput: 100, SavedMicros: 250}}}})).To(BeTrue())
				Expect(ReportTotal(ctx, upgraded)).To(Equal(ledger.Sums{Requests: 5, InputTokens: 400, OutputTokens: 40, CachedTokens: 20, CostMicros: 1400,
					CacheHits: 1, SavedInput: 100, SavedMicros: 250}))
				Expect(upgraded.Close()).To(Succeed())
			}
		})

		It("sums many concurrent settlements exactly, and every report grouped each way equals the sums", func() {
			l := newLedger(sink, func(c *ledger.Config) { c.MaxRows = 1 << 30 })
			records := AddConcurrently(l, 8, 1500)
			Expect(l.Flush(ctx)).To(Succeed())
			Expect(l.Close(ctx)).To(Succeed())
			Expect(ReportTotal(ctx, sink)).To(Equal(Total(records)))
			Expect(Total(records).CostMicros).To(BeNumerically(">", 0))
			Expect(Total(records).CacheHits).To(BeNumerically(">", 0))

			ranges := []ledger.Query{All(), {From: Base.Add(-30*time.Minute - 20*time.Second), To: Base.Add(70*time.Minute + 30*time.Second)}}
			for _, r := range ranges {
				for _, bucket := range []ledger.Bucket{ledger.Whole, ledger.Hour, ledger.Day} {
					groups := [][]ledger.Dimension{nil, {ledger.Tenant, ledger.Model}, {ledger.Team, ledger.User, ledger.APIKey}}
					for _, d := range ledger.Dimensions {
						groups = append(groups, []ledger.Dimension{d})
					}
					for _, g := range groups {
						q := ledger.Query{From: r.From, To: r.To, Bucket: bucket, GroupBy: g}
						rows, err := sink.Report(ctx, q)
						Expect(err).NotTo(HaveOccurred())
						Expect(Got(q, rows)).To(Equal(Expected(q, records)), "grouped by %v per %q from %s", g, bucket, r.From)
					}
				}
			}
		})

		It("filters a report to one tenant", func() {
			l := newLedger(sink, nil)
			records := AddConcurrently(l, 2, 500)
			Expect(l.Close(ctx)).To(Succeed())
			q := ledger.Query{From: All().From, To: All().To, GroupBy: []ledger.Dimension{ledger.Model}, Where: map[ledger.Dimension]string{ledger.Tenant: "team-a-ns"}}
			var mine []ledger.Record
			for _, r := range records {
				if r.Tenant == "team-a-ns" {
					mine = append(mine, r)
				}
			}
			rows, err := sink.Report(ctx, q)
			Expect(err).NotTo(HaveOccurred())
			Expect(Got(q, rows)).To(Equal(Expected(q, mine)))
		})

		It("applies a batch once, however often it is sent", func() {
			b := &ledger.Batch{Replica: "proxy-0@1", Seq: 7, Rows: []ledger.Row{
				{Minute: Base.Unix(), Dims: ledger.Dims{APIKey: "ci", Model: "gpt-4o"}, Sums: ledger.Sums{Requests: 2, InputTokens: 20, CostMicros: 99}},
			}}
			Expect(sink.Apply(ctx, b)).To(BeTrue())
			Expect(sink.Apply(ctx, b)).To(BeFalse(), "the second time")
			other := *b
			other.Seq = 8
			Expect(sink.Apply(ctx, &other)).To(BeTrue(), "the next sequence")
			Expect(ReportTotal(ctx, sink)).To(Equal(ledger.Sums{Requests: 4, InputTokens: 40, CostMicros: 198}))
		})

		It("counts a batch once when the answer to its commit was lost and it is sent again", func() {
			o := &Outage{Sink: sink}
			l := newLedger(o, func(c *ledger.Config) { c.SpoolDir = GinkgoT().TempDir() })
			records := AddConcurrently(l, 4, 200)
			o.LoseAnswers.Store(true)
			Expect(l.Flush(ctx)).To(MatchError(ErrDown))
			Expect(l.Stats().SpoolBatches).To(Equal(1))
			o.LoseAnswers.Store(false)
			Expect(l.Flush(ctx)).To(Succeed())
			st := l.Stats()
			Expect(st.Duplicates).To(Equal(int64(1)))
			Expect(st.SpoolBatches).To(Equal(0))
			Expect(ReportTotal(ctx, sink)).To(Equal(Total(records)))
		})

		It("counts a spooled batch once when it is replayed twice", func() {
			o := &Outage{Sink: sink}
			dir := GinkgoT().TempDir()
			l := newLedger(o, func(c *ledger.Config) { c.SpoolDir = dir })
			records := AddConcurrently(l, 4, 200)
			o.Down.Store(true)
			Expect(l.Flush(ctx)).To(MatchError(ErrDown))
			Expect(l.Stats().SpoolBatches).To(Equal(1))
			// The same spool, as a process that replays it would find it.
			copyDir(dir, filepath.Join(dir, "copy"))
			o.Down.Store(false)
			Expect(l.Close(ctx)).To(Succeed())

			again := newLedger(sink, func(c *ledger.Config) { c.SpoolDir = filepath.Join(dir, "copy") })
			Expect(again.Stats().SpoolBatches).To(Equal(1))
			Expect(again.Flush(ctx)).To(Succeed())
			Expect(again.Stats().Duplicates).To(Equal(int64(1)))
			Expect(ReportTotal(ctx, sink)).To(Equal(Total(records)))
		})

		It("keeps the replica's identity and sequence across a restart of its process, and replays what it spooled", func() {
			o := &Outage{Sink: sink}
			dir := GinkgoT().TempDir()
			first := newLedger(o, func(c *ledger.Config) { c.SpoolDir = dir })
			before := AddConcurrently(first, 2, 300)
			o.Down.Store(true)
			Expect(first.Flush(ctx)).To(MatchError(ErrDown))
			more := AddConcurrently(first, 2, 100)
			Expect(first.Close(ctx)).To(MatchError(ContainSubstring("2 batches")))
			replica := first.Stats().Replica
			Expect(replica).To(HavePrefix("proxy-0@"))

			o.Down.Store(false)
			second := newLedger(o, func(c *ledger.Config) { c.SpoolDir = dir })
			Expect(second.Stats().Replica).To(Equal(replica))
			Expect(second.Stats().SpoolBatches).To(Equal(2))
			after := AddConcurrently(second, 2, 100)
			Expect(second.Close(ctx)).To(Succeed())
			Expect(second.Stats().Flushed).To(Equal(int64(3)), "two replayed, one new: three sequences")
			Expect(ReportTotal(ctx, sink)).To(Equal(Total(append(append(before, more...), after...))))

			// A new pod (a new emptyDir) is a new replica.
			third := newLedger(sink, func(c *ledger.Config) { c.SpoolDir = GinkgoT().TempDir() })
			Expect(third.Stats().Replica).NotTo(Equal(replica))
		})

		It("loses, when its process is killed, only what it held in memory since its last flush", func() {
			o := &Outage{Sink: sink}
			dir := GinkgoT().TempDir()
			killed := newLedger(o, func(c *ledger.Config) { c.SpoolDir = dir })
			o.Down.Store(true)
			spooled := AddConcurrently(killed, 2, 300)
			Expect(killed.Flush(ctx)).To(MatchError(ErrDown))
			inMemory := AddConcurrently(killed, 2, 50)
			// killed is abandoned without Close, as a process killed with SIGKILL is.
			o.Down.Store(false)
			restarted := newLedger(o, func(c *ledger.Config) { c.SpoolDir = dir })
			Expect(restarted.Close(ctx)).To(Succeed())
			// The spooled batch is recorded; the settlements in memory are the loss.
			Expect(ReportTotal(ctx, sink)).To(Equal(Total(spooled)))
			Expect(inMemory).To(HaveLen(100))
		})

		It("counts what a full spool dropped, reports the spool full, and records the rest exactly", func() {
			o := &Outage{Sink: sink}
			var hook atomic.Int64
			l := newLedger(o, func(c *ledger.Config) {
				c.SpoolDir, c.SpoolBytes = GinkgoT().TempDir(), 16<<10
				c.OnDrop = func(d ledger.Dropped) { hook.Add(d.Requests) }
			})
			o.Down.Store(true)
			var records []ledger.Record
			for round := range 40 {
				records = append(records, AddConcurrently(l, 2, 20+round)...)
				Expect(l.Flush(ctx)).To(MatchError(ErrDown))
			}
			st := l.Stats()
			Expect(st.Full).To(BeTrue())
			Expect(l.Refusing()).To(BeFalse(), "keep-serving")
			Expect(st.SpoolBytes).To(BeNumerically("<=", 16<<10))
			Expect(st.Dropped.Batches).To(BeNumerically(">", 0))
			Expect(st.Dropped.Requests).To(Equal(hook.Load()))

			o.Down.Store(false)
			Expect(l.Close(ctx)).To(Succeed())
			Expect(l.Full()).To(BeFalse())
			recorded := ReportTotal(ctx, sink)
			total := Total(records)
			Expect(recorded.Requests + st.Dropped.Requests).To(Equal(total.Requests))
			Expect(recorded.CostMicros + st.Dropped.CostMicros).To(Equal(total.CostMicros))
			Expect(recorded.InputTokens + st.Dropped.InputTokens).To(Equal(total.InputTokens))
		})

		It("reports what a full spool dropped, in batches, rows, requests and dollars, also after its process restarts, and counts none of it twice", func() {
			o := &Outage{Sink: sink}
			dir := GinkgoT().TempDir()
			spool := func(c *ledger.Config) { c.SpoolDir, c.SpoolBytes = dir, 16<<10 }
			l := newLedger(o, spool)
			o.Down.Store(true)
			var records []ledger.Record
			for round := 0; l.Stats().Dropped.Batches < 2; round++ {
				Expect(round).To(BeNumerically("<", 100), "the spool fills")
				records = append(records, AddConcurrently(l, 2, 20+round)...)
				Expect(l.Flush(ctx)).To(MatchError(ErrDown))
			}
			Expect(l.Refusing()).To(BeFalse(), "keep-serving")
			dropped, total := l.Stats().Dropped, Total(records)
			Expect(dropped.CostMicros).To(BeNumerically(">", 0))
			// reported checks the replica's ledger annotation.
			reported := func(l *ledger.Ledger) {
				GinkgoHelper()
				var state map[string]any
				Expect(json.Unmarshal([]byte(l.State().Encode()), &state)).To(Succeed())
				for field, want := range map[string]int64{"dropped_batches": dropped.Batches, "dropped_rows": dropped.Rows,
					"dropped_requests": dropped.Requests, "dropped_cost_micro_usd": dropped.CostMicros} {
					Expect(state).To(HaveKeyWithValue(field, BeNumerically("==", want)), field)
				}
			}
			reported(l)
			// The replica's pending spend holds what waits, not what was dropped.
			pending, err := l.Pending(ctx, All())
			Expect(err).NotTo(HaveOccurred())
			Expect(pending).To(HaveLen(1))
			Expect(pending[0].CostMicros + dropped.CostMicros).To(Equal(total.CostMicros))
			Expect(pending[0].Requests + dropped.Requests).To(Equal(total.Requests))

			// The process is killed (l abandoned, as with SIGKILL) and starts again in
			// the same pod, the database back.
			restarted := newLedger(o, spool)
			reported(restarted)
			o.Down.Store(false)
			Expect(restarted.Close(ctx)).To(Succeed())
			recorded := ReportTotal(ctx, sink)
			Expect(recorded.CostMicros+dropped.CostMicros).To(Equal(total.CostMicros), "each dollar recorded or reported dropped, none both")
			Expect(recorded.Requests + dropped.Requests).To(Equal(total.Requests))
			Expect(restarted.Stats().Dropped).To(Equal(dropped), "the spool's replay adds nothing to what was dropped")
		})

		It("prunes the idempotency keys older than the retention, and only those", func() {
			now := time.Now()
			clock := func() time.Time { return now }
			l := newLedger(sink, func(c *ledger.Config) { c.Now, c.KeyRetention = clock, 48*time.Hour })
			b := &ledger.Batch{Replica: "proxy-9@1", Seq: 1, Rows: []ledger.Row{
				{Minute: Base.Unix(), Dims: ledger.Dims{APIKey: "ci", Model: "gpt-4o"}, Sums: ledger.Sums{Requests: 1, CostMicros: 10}},
			}}
			Expect(sink.Apply(ctx, b)).To(BeTrue())
			now = now.Add(47 * time.Hour)
			Expect(l.Prune(ctx)).To(Equal(int64(0)), "within the retention")
			Expect(sink.Apply(ctx, b)).To(BeFalse(), "the key still answers a replay")
			now = now.Add(2 * time.Hour)
			Expect(l.Prune(ctx)).To(Equal(int64(1)))
			Expect(l.Stats().Pruned).To(Equal(int64(1)))
			Expect(ReportTotal(ctx, sink)).To(Equal(ledger.Sums{Requests: 1, CostMicros: 10}), "pruning keys keeps the rollups")
			Expect(l.Close(ctx)).To(Succeed())
		})

		It("sets aside, unreplayed and counted, a spooled batch older than the key retention allows, and replays a younger one", func() {
			o := &Outage{Sink: sink}
			dir := GinkgoT().TempDir()
			now := time.Now()
			clock := func() time.Time { return now }
			mod := func(c *ledger.Config) { c.SpoolDir, c.Now, c.KeyRetention = dir, clock, 48*time.Hour }
			l := newLedger(o, mod)
			o.Down.Store(true)
			old := AddConcurrently(l, 2, 100)
			Expect(l.Flush(ctx)).To(MatchError(ErrDown))
			Expect(l.Stats().Oldest).To(BeTemporally("==", now.Truncate(time.Second)))
			now = now.Add(40 * time.Hour)
			young := AddConcurrently(l, 1, 50)
			Expect(l.Flush(ctx)).To(MatchError(ErrDown))
			Expect(l.Stats().SpoolBatches).To(Equal(2))
			Expect(l.Stats().FlushedThrough.IsZero()).To(BeTrue(), "nothing flushed yet")

			now = now.Add(7*time.Hour + time.Minute) // the first is 47 h old: past 48 h less the margin
			o.Down.Store(false)
			Expect(l.Flush(ctx)).To(Succeed())
			st := l.Stats()
			Expect(st.Expired.Batches).To(Equal(int64(1)))
			Expect(st.Expired.Requests).To(Equal(Total(old).Requests))
			Expect(st.Expired.CostMicros).To(Equal(Total(old).CostMicros))
			Expect(st.SpoolBatches).To(Equal(0))
			Expect(st.Oldest.IsZero()).To(BeTrue())
			Expect(st.FlushedThrough).To(Equal(now))
			Expect(ReportTotal(ctx, sink)).To(Equal(Total(young)))
			Expect(l.Close(ctx)).To(Succeed())
		})

		It("under refuse, keeps in memory the batch that found the spool full, refuses and counts meanwhile, and records it all once the database is back", func() {
			o := &Outage{Sink: sink}
			l := newLedger(o, func(c *ledger.Config) {
				c.SpoolDir, c.SpoolBytes, c.WhenFull = GinkgoT().TempDir(), 16<<10, ledger.Refuse
			})
			o.Down.Store(true)
			var records []ledger.Record
			for round := 0; !l.Refusing(); round++ {
				Expect(round).To(BeNumerically("<", 40), "the spool fills")
				_, refused := l.Refuse()
				Expect(refused).To(BeFalse(), "while the spool has room")
				records = append(records, AddConcurrently(l, 2, 20+round)...)
				Expect(l.Flush(ctx)).To(MatchError(ErrDown))
			}
			wait, refused := l.Refuse()
			Expect(refused).To(BeTrue())
			Expect(wait).To(Equal(10*time.Second), "a flush interval")
			st := l.Stats()
			Expect(st.Full).To(BeTrue())
			Expect(st.Refused).To(Equal(int64(1)))
			Expect(st.Dropped).To(Equal(ledger.Dropped{}), "nothing is dropped")
			// The requests no cost budget governs are still served and recorded.
			records = append(records, AddConcurrently(l, 1, 30)...)
			Expect(l.Flush(ctx)).To(MatchError(ErrDown))
			Expect(l.Refusing()).To(BeTrue())

			o.Down.Store(false)
			Expect(l.Flush(ctx)).To(Succeed())
			Expect(l.Refusing()).To(BeFalse(), "the spool drained")
			Expect(l.Close(ctx)).To(Succeed())
			Expect(l.Stats().Dropped).To(Equal(ledger.Dropped{}))
			Expect(ReportTotal(ctx, sink)).To(Equal(Total(records)))
		})

		It("keeps serving by default while the spool is full", func() {
			o := &Outage{Sink: sink}
			l := newLedger(o, func(c *ledger.Config) { c.SpoolBytes = 1 })
			o.Down.Store(true)
			AddConcurrently(l, 1, 10)
			Expect(l.Flush(ctx)).To(HaveOccurred())
			Expect(l.Full()).To(BeTrue())
			Expect(l.Refusing()).To(BeFalse())
			Expect(l.Stats().Dropped.Requests).To(Equal(int64(10)))
		})
	})
}

// copyDir copies the files of a directory.
func copyDir(from, to string) {
	Expect(os.MkdirAll(to, 0o750)).To(Succeed())
	entries, err := os.ReadDir(from)
	Expect(err).NotTo(HaveOccurred())
	for _, e := range entries {
		if e.IsDir() {
			continue
		}
		raw, err := os.ReadFile(filepath.Join(from, e.Name()))
		Expect(err).NotTo(HaveOccurred())
		Expect(os.WriteFile(filepath.Join(to, e.Name()), raw, 0o640)).To(Succeed())
	}
}
