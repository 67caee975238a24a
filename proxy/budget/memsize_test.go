// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package budget_test

import (
	"context"
	"fmt"
	"runtime"
	"testing"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
)

// BenchmarkBucketMemory reports the heap bytes each live bucket costs, with 100,000
// and 1,000,000 client buckets in the memory store (one minute bucket per client
// address, the address string included).
func BenchmarkBucketMemory(b *testing.B) {
	for _, n := range []int{100_000, 1_000_000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			for b.Loop() {
				runtime.GC()
				var before, after runtime.MemStats
				runtime.ReadMemStats(&before)
				m := budget.NewMemory(budget.SystemClock{}, int64(n))
				ctx := context.Background()
				for i := range n {
					id := fmt.Sprintf("10.%d.%d.%d", i>>16&255, i>>8&255, i&255)
					c := budget.Charge{Key: budget.Key{Kind: budget.TokensMinute, Dim: budget.Client, ID: id}, Capacity: 1000, Rate: 1000.0 / 60}
					if _, err := m.Reserve(ctx, &budget.Reservation{Tokens: budget.WithAmount([]budget.Charge{c}, 10)}); err != nil {
						b.Fatal(err)
					}
				}
				runtime.GC()
				runtime.ReadMemStats(&after)
				if m.Len(budget.TokensMinute) != int64(n) {
					b.Fatalf("%d buckets, want %d", m.Len(budget.TokensMinute), n)
				}
				b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/float64(n), "bytes/bucket")
				runtime.KeepAlive(m)
			}
		})
	}
}
