// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
)

// BenchmarkReserveDurable is BenchmarkReserveSettle's reservation with one more
// bucket, a calendar month's cost counter, which is durable: each reservation is
// checked against the trust fence (the epoch key read by the same MGET, in the same
// script call). Compare it with BenchmarkReserveSettle to see what a durable counter
// costs, and across versions to see what the fence costs.
func BenchmarkReserveDurable(b *testing.B) {
	s := benchStore(b)
	ctx := context.Background()
	r := everyDimensionOf(400, "bench", 1e15)
	r.Tokens = append(r.Tokens, budget.Charge{Key: budget.Key{Kind: budget.Calendar, Dim: budget.Team, ID: "bench", Rule: "monthly", Start: 1},
		Capacity: 1e15, SharedCapacity: 1e15, Amount: 0.01, EndMillis: time.Now().Add(24 * time.Hour).UnixMilli(), Durable: true})
	if _, err := s.Reserve(ctx, r); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		res, err := s.Reserve(ctx, r)
		if err != nil || !res.Admitted {
			b.Fatalf("not admitted: %v", err)
		}
	}
	b.StopTimer()
	calls, perCall := commandstatB(b, s, "evalsha")
	b.ReportMetric(float64(calls)*perCall/float64(b.N+1), "redis-µs/admission")
}
