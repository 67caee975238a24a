// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package redisstore

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/test/redisserver"
)

// BenchmarkApplyScript is Redis' own CPU in one apply script call as a pipeline sends
// it under load: the refunds of the previous pipeline's requests, then the
// reservations of the requests waiting, each on six dimensions times two periods
// (twelve buckets), for requests of one subject (six keys, one per dimension) and
// of one subject each (the global, model and team keys shared, the others each
// request's own). One op is one script call. It reports the redis-server process' CPU
// (user and system, from INFO cpu) per call and per request (its reservation and its
// refund), which a loaded host inflates less than wall time.
func BenchmarkApplyScript(b *testing.B) {
	for _, c := range []struct {
		name     string
		requests int
		subjects int
	}{{"8-requests-one-subject", 8, 1}, {"50-requests-one-subject", 50, 1}, {"8-requests-8-subjects", 8, 8}} {
		b.Run(c.name, func(b *testing.B) { benchApply(b, c.requests, c.subjects) })
	}
}

func benchApply(b *testing.B, requests, subjects int) {
	rs := redisserver.Start(b)
	s, err := New(Options{URL: rs.URL(), DialTimeout: time.Second, ReadTimeout: time.Second, WriteTimeout: time.Second})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = s.Close() })
	const total = 1e15
	var reserves []*budget.Reservation
	var refund []refundEntry
	for i := range requests {
		g := i % subjects
		ids := [budget.NumDimensions]string{
			budget.Global: "", budget.Client: fmt.Sprint("10.0.0.", g), budget.APIKey: fmt.Sprint("key-", g),
			budget.User: fmt.Sprint("user-", g), budget.Team: "research", budget.Model: "gpt-4o",
		}
		r := &budget.Reservation{}
		for d := budget.Global; d < budget.NumDimensions; d++ {
			for _, k := range []budget.Kind{budget.TokensMinute, budget.TokensDay} {
				secs := k.Period().Seconds()
				ch := budget.Charge{Key: budget.Key{Kind: k, Dim: d, ID: ids[d]},
					Capacity: total, Rate: total / secs, SharedCapacity: total, SharedRate: total / secs, Amount: 400}
				r.Tokens = append(r.Tokens, ch)
				refund = append(refund, refundEntry{refundBucket{ch.Key, ch.SharedCapacity, ch.SharedRate}, 300})
			}
		}
		reserves = append(reserves, r)
	}
	refund = mergeRefunds([]*refunds{func() *refunds {
		r := newRefunds(len(refund))
		for _, e := range refund {
			r.add([]budget.Charge{{Key: e.key, SharedCapacity: e.capacity, SharedRate: e.rate, Amount: e.amount}})
		}
		return r
	}()})
	keys, args, _ := s.apply(0, refund, reserves)
	ctx := context.Background()
	c := s.Client()
	if err := applyScript.Run(ctx, c, keys, args...).Err(); err != nil {
		b.Fatal(err)
	}
	cpu := func() float64 {
		sec, err := redisserver.CPUSeconds(ctx, c)
		if err != nil {
			b.Fatal(err)
		}
		return sec
	}
	const perPipeline = 16
	cpu0 := cpu()
	b.ResetTimer()
	for i := 0; i < b.N; i += perPipeline {
		pipe := c.Pipeline()
		for j := i; j < min(b.N, i+perPipeline); j++ {
			applyScript.EvalSha(ctx, pipe, keys, args...)
		}
		if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	used := (cpu() - cpu0) * 1e6 / float64(b.N)
	b.ReportMetric(used, "redis-cpu-µs/call")
	b.ReportMetric(used/float64(requests), "redis-cpu-µs/request")
}
