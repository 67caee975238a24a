// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package redisstore_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/proxy/budget/redisstore"
	"github.com/tokenwarden/tokenwarden/test/redisserver"
)

// BenchmarkLayouts is admissions and their settlements from 64 goroutines on every
// dimension and both periods (twelve buckets: the global one, four models, eight
// teams, and an API key, user and client per goroutine), on one redis-server and on a
// three-master cluster, each with and without leased slices of the hot shared budgets
// (the global and per-model ones, slices of 1%). It reports the admissions per second
// (admission and settlement), the script calls per admission, and Redis' own time
// per admitted and settled request (evalsha usec from INFO commandstats, summed over
// the cluster's masters). Two cores run the proxy and every Redis here: the throughput
// compares layouts on this machine, it does not show a cluster outrunning one server.
func BenchmarkLayouts(b *testing.B) {
	for _, layout := range []struct {
		name    string
		cluster bool
		lease   float64
	}{
		{"single", false, 0}, {"single-leased", false, 0.01},
		{"cluster", true, 0}, {"cluster-leased", true, 0.01},
	} {
		b.Run(layout.name, func(b *testing.B) {
			var url string
			if layout.cluster {
				url = redisserver.StartCluster(b, 3, 0).URL()
			} else {
				url = redisserver.Start(b).URL()
			}
			s, err := redisstore.New(redisstore.Options{URL: url, LeaseFraction: layout.lease,
				DialTimeout: time.Second, ReadTimeout: time.Second, WriteTimeout: time.Second})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = s.Close() })
			benchLayout(b, s)
		})
	}
}

// fleetRequest is one request of goroutine g on every dimension and both periods.
func fleetRequest(g int) *budget.Reservation {
	ids := [budget.NumDimensions]string{
		budget.Global: "", budget.Client: fmt.Sprint("10.0.0.", g), budget.APIKey: fmt.Sprint("key-", g),
		budget.User: fmt.Sprint("user-", g), budget.Team: fmt.Sprint("team-", g%8), budget.Model: fmt.Sprint("model-", g%4),
	}
	const total = 1e15
	r := &budget.Reservation{}
	for d := budget.Global; d < budget.NumDimensions; d++ {
		for _, k := range []budget.Kind{budget.TokensMinute, budget.TokensDay} {
			secs := k.Period().Seconds()
			r.Tokens = append(r.Tokens, budget.Charge{Key: budget.Key{Kind: k, Dim: d, ID: ids[d]},
				Capacity: total, Rate: total / secs, SharedCapacity: total, SharedRate: total / secs, Amount: 400})
		}
	}
	return r
}

func benchLayout(b *testing.B, s *redisstore.Store) {
	ctx := context.Background()
	for g := range 64 { // load the scripts, create the keys
		if _, err := s.Reserve(ctx, fleetRequest(g)); err != nil {
			b.Fatal(err)
		}
	}
	resetStats(b, s)
	var next atomic.Int64
	b.SetParallelism(32) // 64 goroutines on GOMAXPROCS 2
	b.ResetTimer()
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		r := fleetRequest(int(next.Add(1)-1) % 64)
		for pb.Next() {
			res, err := s.Reserve(ctx, r)
			if err != nil || !res.Admitted {
				b.Errorf("not admitted: %v", err)
				return
			}
			s.Refund(ctx, budget.WithAmount(r.Tokens, 300))
		}
	})
	elapsed := time.Since(start)
	b.StopTimer()
	calls, usec := evalshaStats(b, s)
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "admissions/s")
	b.ReportMetric(float64(calls)/float64(b.N), "calls/admission")
	b.ReportMetric(usec/float64(b.N), "redis-µs/admission+settlement")
}

// masters runs f on every master: the cluster's, or the one server.
func masters(s *redisstore.Store, f func(c redis.Cmdable) error) error {
	if cc, ok := s.Client().(*redis.ClusterClient); ok {
		return cc.ForEachMaster(context.Background(), func(_ context.Context, c *redis.Client) error { return f(c) })
	}
	return f(s.Client())
}

func resetStats(b *testing.B, s *redisstore.Store) {
	if err := masters(s, func(c redis.Cmdable) error { return c.ConfigResetStat(context.Background()).Err() }); err != nil {
		b.Fatal(err)
	}
}

// evalshaStats sums the script calls and Redis' time in them over the masters.
func evalshaStats(b *testing.B, s *redisstore.Store) (calls int64, usec float64) {
	var mu sync.Mutex
	err := masters(s, func(c redis.Cmdable) error {
		n, u, err := redisserver.Commandstat(context.Background(), c, "evalsha")
		mu.Lock()
		calls += n
		usec += u
		mu.Unlock()
		return err
	})
	if err != nil {
		b.Fatal(err)
	}
	return calls, usec
}
