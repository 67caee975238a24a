// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package budget_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
)

// BenchmarkEachLevel scans 100,000 token buckets (50,000 keys, both periods): a scan
// takes each of the 64 shard locks once, so a request waits at most for a 64th of it.
func BenchmarkEachLevel(b *testing.B) {
	m := budget.NewMemory(budget.SystemClock{}, 1<<20)
	for i := range 50000 {
		id := fmt.Sprintf("key-%05d", i)
		_, err := m.Reserve(context.Background(), &budget.Reservation{Tokens: budget.WithAmount([]budget.Charge{
			{Key: budget.Key{Kind: budget.TokensMinute, Dim: budget.APIKey, ID: id}, Capacity: 1000, Rate: 1000.0 / 60},
			{Key: budget.Key{Kind: budget.TokensDay, Dim: budget.APIKey, ID: id}, Capacity: 100000, Rate: 100000.0 / 86400},
		}, 10)})
		if err != nil {
			b.Fatal(err)
		}
	}
	n := 0
	b.ResetTimer()
	for range b.N {
		if err := m.EachLevel(context.Background(), func(budget.Key, float64, float64) { n++ }); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(n)/float64(b.N), "buckets")
}
