// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package redisstore_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/proxy/budget/redisstore"
	"github.com/tokenwarden/tokenwarden/test/redisserver"
)

// BenchmarkReserveSettle is admissions on six dimensions times two periods (twelve
// buckets) and their refunds, on a real redis-server, one at a time and from 64
// goroutines at once. It reports, from INFO commandstats, the script calls per
// admission and per settlement, and Redis' own time in the scripts per admission and
// per settlement (usec of evalsha).
func BenchmarkReserveSettle(b *testing.B) {
	b.Run("one-at-a-time", func(b *testing.B) { benchReserveSettle(b, 1) })
	b.Run("64-concurrent", func(b *testing.B) { benchReserveSettle(b, 64) })
}

func benchReserveSettle(b *testing.B, parallelism int) {
	s := benchStore(b)
	ctx := context.Background()
	r := everyDimensionOf(400, "bench", 1e15)
	if _, err := s.Reserve(ctx, r); err != nil { // load the script
		b.Fatal(err)
	}
	stats := func() (calls int64, usec float64) {
		calls, perCall := commandstatB(b, s, "evalsha")
		return calls, float64(calls) * perCall
	}
	run := func(op func()) {
		if parallelism == 1 {
			for i := 0; i < b.N; i++ {
				op()
			}
			return
		}
		b.SetParallelism(parallelism / 2) // GOMAXPROCS is 2 here
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				op()
			}
		})
	}
	s.Client().ConfigResetStat(ctx)

	b.ReportAllocs()
	b.ResetTimer()
	run(func() {
		res, err := s.Reserve(ctx, r)
		if err != nil || !res.Admitted {
			b.Errorf("not admitted: %v", err)
		}
	})
	b.StopTimer()
	reserveCalls, reserveUsec := stats()
	b.StartTimer()
	run(func() { s.Refund(ctx, budget.WithAmount(r.Tokens, 300)) })
	b.StopTimer()
	allCalls, allUsec := stats()
	b.ReportMetric(float64(reserveCalls)/float64(b.N), "calls/admission")
	b.ReportMetric(float64(allCalls-reserveCalls)/float64(b.N), "calls/settlement")
	b.ReportMetric(reserveUsec/float64(b.N), "redis-µs/admission")
	b.ReportMetric((allUsec-reserveUsec)/float64(b.N), "redis-µs/settlement")
}

// BenchmarkRoundTrip is the floor under every Redis call: a script that does nothing,
// called through go-redis one call at a time. It reports the round trip (ns/op) and
// Redis' own time in the call (usec_per_call of evalsha).
func BenchmarkRoundTrip(b *testing.B) {
	rs := redisserver.Start(b)
	c := redis.NewClient(&redis.Options{Addr: rs.Addr()})
	defer c.Close()
	ctx := context.Background()
	noop := redis.NewScript("return 1")
	if err := noop.Run(ctx, c, nil).Err(); err != nil {
		b.Fatal(err)
	}
	c.ConfigResetStat(ctx)
	for b.Loop() {
		if err := noop.EvalSha(ctx, c, nil).Err(); err != nil {
			b.Fatal(err)
		}
	}
	calls, usec, err := redisserver.Commandstat(ctx, c, "evalsha")
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(perCall(calls, usec), "redis-µs/call")
}

// benchStore is a store on a redis-server of its own, closed with the benchmark.
func benchStore(b *testing.B) *redisstore.Store {
	rs := redisserver.Start(b)
	s, err := redisstore.New(redisstore.Options{URL: rs.URL(), DialTimeout: time.Second, ReadTimeout: time.Second, WriteTimeout: time.Second})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = s.Close() })
	return s
}

// BenchmarkKeyMemory reports the memory Redis uses per key (one client address with a
// minute and a day bucket), read from INFO memory around 100,000 reservations on
// distinct addresses. Run it with -benchtime=1x.
func BenchmarkKeyMemory(b *testing.B) {
	s := benchStore(b)
	ctx := context.Background()
	used := func() float64 {
		info, err := s.Client().Info(ctx, "memory").Result()
		if err != nil {
			b.Fatal(err)
		}
		for _, line := range strings.Split(info, "\r\n") {
			if v, ok := strings.CutPrefix(line, "used_memory:"); ok {
				n, _ := strconv.ParseFloat(v, 64)
				return n
			}
		}
		b.Fatal("no used_memory in INFO memory")
		return 0
	}
	const keys = 100000
	before := used()
	for b.Loop() {
		var wg sync.WaitGroup
		for w := 0; w < 64; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := w; i < keys; i += 64 {
					id := fmt.Sprintf("10.%d.%d.%d", i>>16, (i>>8)&255, i&255)
					r := &budget.Reservation{}
					for _, k := range []budget.Kind{budget.TokensMinute, budget.TokensDay} {
						secs := k.Period().Seconds()
						r.Tokens = append(r.Tokens, budget.Charge{Key: budget.Key{Kind: k, Dim: budget.Client, ID: id},
							SharedCapacity: 100000, SharedRate: 100000 / secs, Amount: 100})
					}
					if _, err := s.Reserve(ctx, r); err != nil {
						b.Error(err)
						return
					}
				}
			}()
		}
		wg.Wait()
	}
	b.ReportMetric((used()-before)/keys, "bytes/key")
}
