// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package server_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/tokenwarden/tokenwarden/test/redisserver"
)

// benchRedis is the redis-server a benchmark's proxy uses, if any, by benchmark.
var benchRedis sync.Map

// benchCost is what a timed benchmark loop cost the machine's cores, read at its start
// and end: the CPU of the whole test process (load generator, proxy and backend, user
// and system) and, when the benchmark has a redis-server, that server's CPU (INFO cpu)
// and its script calls and time in them (INFO commandstats). Per op, CPU is steadier
// than wall time on a shared host, and on two cores it is what throughput is made of.
type benchCost struct {
	b                 *testing.B
	cpu               time.Duration
	rs                *redisserver.Server
	rcpu, calls, usec float64
}

// startCost reads the counters at the start of b's timed loop.
func startCost(b *testing.B) *benchCost {
	c := &benchCost{b: b, cpu: processCPU()}
	if rs, ok := benchRedis.Load(b); ok {
		c.rs = rs.(*redisserver.Server)
		c.rcpu, c.calls, c.usec = redisCost(b, c.rs)
	}
	return c
}

// report reports the cost per op since startCost: cpu-µs/op, and for Redis
// redis-cpu-µs/op, redis-calls/op and redis-µs/op (the time in the scripts).
func (c *benchCost) report() {
	n := float64(c.b.N)
	if cpu := processCPU() - c.cpu; cpu > 0 && n > 0 {
		// The process's CPU time a request, client, proxy and backend together: it
		// moves less than ns/op with what else the host runs.
		c.b.ReportMetric(float64(cpu.Nanoseconds())/n/1000, "cpu-µs/op")
	}
	if c.rs != nil {
		rcpu, calls, usec := redisCost(c.b, c.rs)
		c.b.ReportMetric((rcpu-c.rcpu)*1e6/n, "redis-cpu-µs/op")
		c.b.ReportMetric((calls-c.calls)/n, "redis-calls/op")
		c.b.ReportMetric((usec-c.usec)/n, "redis-µs/op")
	}
}

// redisCost reads Redis' CPU seconds and its evalsha calls and microseconds.
func redisCost(b *testing.B, rs *redisserver.Server) (cpu, calls, usec float64) {
	ctx := context.Background()
	rc := rs.Client()
	cpu, err := redisserver.CPUSeconds(ctx, rc)
	if err != nil {
		b.Fatal(err)
	}
	n, usec, err := redisserver.Commandstat(ctx, rc, "evalsha")
	if err != nil {
		b.Fatal(err)
	}
	return cpu, float64(n), usec
}
