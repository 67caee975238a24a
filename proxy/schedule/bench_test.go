// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package schedule_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/tokenwarden/tokenwarden/proxy/schedule"
)

// BenchmarkAcquireBelowCapacity is the path of every request while the upstream is
// below its capacity: a place taken and given back, without waiting.
func BenchmarkAcquireBelowCapacity(b *testing.B) {
	s := schedule.New(schedule.Options{MaxInFlightRequests: 1 << 30, MaxInFlightTokens: 1 << 40})
	ctx := context.Background()
	r := schedule.Request{Tenant: "a", Class: schedule.Batch, Input: 1000, Output: 200}
	b.ReportAllocs()
	for b.Loop() {
		sl, err := s.Acquire(ctx, r)
		if err != nil {
			b.Fatal(err)
		}
		sl.Done(900, 150)
	}
}

// BenchmarkQueue measures one dispatch and one enqueue with n requests of k keys
// waiting (three classes): each op ends one running request, which dispatches the next
// waiter, and that waiter's goroutine queues again, keeping the queue at n.
func BenchmarkQueue(b *testing.B) {
	for _, c := range []struct{ n, keys int }{{100, 100}, {10000, 100}, {10000, 10000}} {
		n := c.n
		b.Run(fmt.Sprintf("waiting=%d/keys=%d", c.n, c.keys), func(b *testing.B) {
			s := schedule.New(schedule.Options{MaxInFlightRequests: 1, MaxQueueLength: n + 1, OutputWeight: 2})
			ctx, cancel := context.WithCancel(context.Background())
			running, _ := s.Acquire(ctx, schedule.Request{Tenant: "first"})
			slots := make(chan schedule.Slot)
			for i := range n {
				go func() {
					r := schedule.Request{Tenant: fmt.Sprint("key", i%c.keys), Class: schedule.Class(i % 3), Input: int64(100 + i%4000), Output: 200}
					for {
						sl, err := s.Acquire(ctx, r)
						if err != nil {
							return
						}
						select {
						case slots <- sl:
						case <-ctx.Done():
							sl.Done(0, 0)
							return
						}
					}
				}()
			}
			waitFor(b, "the queue to fill", func() bool { return waiting(s) == n })
			b.ResetTimer()
			for range b.N {
				running.Done(100, 200)
				running = <-slots
			}
			b.StopTimer()
			cancel()
			running.Done(0, 0)
		})
	}
}
