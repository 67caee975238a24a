// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package ledger_test

import (
	"context"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/proxy/ledger"
	"github.com/tokenwarden/tokenwarden/proxy/ledger/ledgertest"
	"github.com/tokenwarden/tokenwarden/test/pgserver"
)

// counting is a sink that counts the rows and time of the batches it applies.
type counting struct {
	ledger.Sink
	batches, rows atomic.Int64
	busy          atomic.Int64 // nanoseconds in Apply
}

func (c *counting) Apply(ctx context.Context, b *ledger.Batch) (bool, error) {
	start := time.Now()
	ok, err := c.Sink.Apply(ctx, b)
	c.busy.Add(int64(time.Since(start)))
	if err == nil {
		c.batches.Add(1)
		c.rows.Add(int64(len(b.Rows)))
	}
	return ok, err
}

// TestThroughput measures, at a realistic shape, what a million requests make of the
// ledger (rows written, rows kept, bytes in PostgreSQL) and how many rollup writes per
// second one PostgreSQL takes. It runs with LEDGER_THROUGHPUT=1 (make ledger-throughput).
//
// The shape: a million requests over an hour from one replica, 500 API keys of 200
// users in 40 teams and 2 tenants, 4 models on 2 upstreams each, flushed every 10s.
func TestThroughput(t *testing.T) {
	if os.Getenv("LEDGER_THROUGHPUT") == "" {
		t.Skip("a measurement: run with LEDGER_THROUGHPUT=1 (make ledger-throughput)")
	}
	ctx := context.Background()
	srv := pgserver.Start(t)
	sink, err := ledger.Open(ctx, srv.NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	c := &counting{Sink: sink}
	l, err := ledger.New(ledger.Config{Sink: c, Pod: "proxy-0", SpoolDir: t.TempDir(), FlushInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	const requests = 1_000_000
	models := []string{"gpt-4o", "gpt-4o-mini", "claude-sonnet", "gpt-4o"}
	upstreams := [][]string{{"openai", "azure"}, {"openai", "azure"}, {"anthropic", "bedrock"}, {"openai", "azure"}}
	start := ledgertest.Base
	next := start.Add(10 * time.Second)
	var addTime time.Duration
	for i := range requests {
		h := uint64(i)*0x9e3779b97f4a7c15 ^ uint64(i)>>7
		key := int(h % 500)
		m := int(h>>20) % len(models)
		u := budget.Used{Input: int64(200 + h>>30%3000), Output: int64(20 + h>>40%800)}
		cost, _ := ledgertest.Prices.CostMicros(models[m], u)
		rec := ledger.Record{
			Time: start.Add(time.Duration(i) * time.Hour / requests),
			Dims: ledger.Dims{Fleet: "platform", Tenant: fmt.Sprintf("tenant-%d", key%2), APIKey: fmt.Sprintf("key-%03d", key),
				User: fmt.Sprintf("user-%03d", key%200), Team: fmt.Sprintf("team-%02d", key%40), Model: models[m],
				Upstream: upstreams[m][int(h>>50)%2]},
			Used: u, CostMicros: cost,
		}
		if rec.Time.After(next) {
			if err := l.Flush(ctx); err != nil {
				t.Fatal(err)
			}
			next = next.Add(10 * time.Second)
		}
		t0 := time.Now()
		l.Add(rec)
		addTime += time.Since(t0)
	}
	if err := l.Close(ctx); err != nil {
		t.Fatal(err)
	}
	var kept, bytes int64
	if err := sink.DB().QueryRowContext(ctx, "SELECT count(*), pg_total_relation_size('ledger_rollups') + pg_total_relation_size('ledger_batches') FROM ledger_rollups").Scan(&kept, &bytes); err != nil {
		t.Fatal(err)
	}
	t.Logf("a million requests: %d batches, %d rollup rows written (upserts), %d rows kept, %.1f MiB in PostgreSQL (tables and indexes); Add %.0f ns each; %.0f rows/s applied by one replica's flushes",
		c.batches.Load(), c.rows.Load(), kept, float64(bytes)/(1<<20), float64(addTime.Nanoseconds())/requests,
		float64(c.rows.Load())/time.Duration(c.busy.Load()).Seconds())

	// How many rollup writes per second one PostgreSQL takes: replicas flushing at once,
	// batches of 1,000 rows of the same shape, for ten seconds.
	for _, replicas := range []int{1, 4} {
		var rows atomic.Int64
		var wg sync.WaitGroup
		deadline := time.Now().Add(10 * time.Second)
		t0 := time.Now()
		for r := range replicas {
			wg.Go(func() {
				for seq := int64(1); time.Now().Before(deadline); seq++ {
					b := &ledger.Batch{Replica: fmt.Sprintf("bench-%d-%d", replicas, r), Seq: seq}
					for k := range 1000 {
						b.Rows = append(b.Rows, ledger.Row{Minute: start.Unix() + 60*(seq%60),
							Dims: ledger.Dims{Fleet: "platform", Tenant: "tenant-0", APIKey: fmt.Sprintf("key-%03d", k%500),
								User: fmt.Sprintf("user-%03d", k%200), Team: "team-00", Model: models[k/500], Upstream: "openai"},
							Sums: ledger.Sums{Requests: 1, InputTokens: 100, OutputTokens: 10, CostMicros: 350}})
					}
					if _, err := sink.Apply(ctx, b); err != nil {
						t.Error(err)
						return
					}
					rows.Add(int64(len(b.Rows)))
				}
			})
		}
		wg.Wait()
		t.Logf("%d replica(s) flushing at once: %.0f rollup rows/s into one PostgreSQL", replicas, float64(rows.Load())/time.Since(t0).Seconds())
	}
}

// BenchmarkAdd is what recording costs a settlement on the request path: an addition
// to the minute's row in memory, from every core at once, at the throughput shape
// (500 keys, 3 models). No flush runs.
func BenchmarkAdd(b *testing.B) {
	l, err := ledger.New(ledger.Config{Sink: discard{}, Pod: "bench", FlushInterval: -1, MaxRows: 1 << 30})
	if err != nil {
		b.Fatal(err)
	}
	recs := make([]ledger.Record, 4096)
	for i := range recs {
		recs[i] = ledgertest.Settlement(0, i)
		recs[i].APIKey = fmt.Sprintf("key-%03d", i%500)
		recs[i].Time = ledgertest.Base
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for i := 0; pb.Next(); i++ {
			l.Add(recs[i%len(recs)])
		}
	})
}

// discard is a sink that takes every batch and keeps nothing.
type discard struct{}

func (discard) Apply(context.Context, *ledger.Batch) (bool, error) { return true, nil }
func (discard) Report(context.Context, ledger.Query) ([]ledger.ReportRow, error) {
	return nil, nil
}
func (discard) Close() error { return nil }

func (discard) Prune(context.Context, time.Time) (int64, error) { return 0, nil }
