// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/proxy/budget/redisstore"
	"github.com/tokenwarden/tokenwarden/test/redisserver"
)

// BenchmarkReserveSettle is one admission on six dimensions times two periods and its
// settlement, on a real redis-server. It reports the script calls per admission and per
// settlement read from INFO commandstats, and the reserve script's own cost inside
// Redis (usec_per_call of evalsha over reservations only).
func BenchmarkReserveSettle(b *testing.B) {
	rs := redisserver.Start(b)
	s, err := redisstore.New(redisstore.Options{URL: rs.URL(), DialTimeout: time.Second, ReadTimeout: time.Second, WriteTimeout: time.Second})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	r := everyDimensionBench(400)
	if _, err := s.Reserve(ctx, r); err != nil { // load the script
		b.Fatal(err)
	}
	stats := func() (int64, float64) {
		calls, usec := commandstatB(b, s, "evalsha")
		return calls, usec
	}
	s.Client().ConfigResetStat(ctx)

	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		res, err := s.Reserve(ctx, r)
		if err != nil || !res.Admitted {
			b.Fatalf("not admitted: %v", err)
		}
	}
	b.StopTimer()
	reserveCalls, reserveUsec := stats()
	b.StartTimer()
	for i := 0; i < b.N; i++ {
		s.Refund(ctx, r.Tokens, 300)
	}
	b.StopTimer()
	allCalls, _ := stats()
	b.ReportMetric(float64(reserveCalls)/float64(b.N), "calls/admission")
	b.ReportMetric(float64(allCalls-reserveCalls)/float64(b.N), "calls/settlement")
	b.ReportMetric(reserveUsec, "redis-µs/reserve")
}

func everyDimensionBench(amount int64) *budget.Reservation {
	r := &budget.Reservation{Amount: amount}
	for d := budget.Global; d < budget.NumDimensions; d++ {
		for _, k := range []budget.Kind{budget.TokensMinute, budget.TokensDay} {
			secs := k.Period().Seconds()
			r.Tokens = append(r.Tokens, budget.Charge{Key: budget.Key{Kind: k, Dim: d, ID: "bench"},
				SharedCapacity: 1e15, SharedRate: 1e15 / secs})
		}
	}
	return r
}
