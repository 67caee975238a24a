// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package report

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
)

// BenchmarkSummaryMemory scans a replica's memory holding 50,000 keys' minute and day
// buckets, every one in use.
func BenchmarkSummaryMemory(b *testing.B) {
	mem := budget.NewMemory(budget.SystemClock{}, 1<<20)
	for i := range 50000 {
		id := fmt.Sprintf("team-%03d_key-%05d", i%300, i)
		res, err := mem.Reserve(context.Background(), &budget.Reservation{
			Tokens: budget.WithAmount([]budget.Charge{tokens(budget.TokensMinute, budget.APIKey, id, 1000), tokens(budget.TokensDay, budget.APIKey, id, 100000)}, float64(1+i%900))})
		if err != nil || !res.Admitted {
			b.Fatal(res, err)
		}
	}
	s := &Summarizer{Levels: mem, Every: 15 * time.Second}
	var size int
	b.ResetTimer()
	for range b.N {
		u, err := s.Summary(context.Background())
		if err != nil {
			b.Fatal(err)
		}
		size = len(u.Encode())
	}
	b.ReportMetric(float64(size), "report-bytes")
}
