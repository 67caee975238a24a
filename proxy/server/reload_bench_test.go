// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package server_test

import (
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/proxy/config"
	"github.com/tokenwarden/tokenwarden/proxy/metrics"
	"github.com/tokenwarden/tokenwarden/proxy/server"
)

// fleetDoc is the document the operator renders for a platform's fleet of keys keys
// (key-000000..., user-<i>, team-<i mod 100>, as the operator's benchmark creates them)
// and budgets per_model budgets, divided among three replicas, at generation g.
func fleetDoc(tb testing.TB, keys, budgets int, g int64) []byte {
	tb.Helper()
	c := &config.Config{Generation: g, Listen: "0.0.0.0:8080", AdminListen: "0.0.0.0:9090",
		Auth:      config.Auth{Mode: config.AuthRequired},
		Upstreams: []config.Upstream{{Name: "fake", URL: "http://127.0.0.1:8000"}}}
	c.APIKeys = make([]config.APIKey, 0, keys)
	for i := range keys {
		c.APIKeys = append(c.APIKeys, config.APIKey{Name: fmt.Sprintf("key-%06d", i), KeySHA256: keyHash(fmt.Sprintf("sk-large-%d", i)),
			User: fmt.Sprintf("user-%d", i), Team: fmt.Sprintf("team-%d", i%100)})
	}
	rl := &c.RateLimiting
	rl.Storage = config.StorageMemory
	rl.BudgetDivision.Replicas = 3
	rl.Limits.PerModel = make(map[string]config.DimensionLimits, budgets)
	for i := range budgets {
		rl.Limits.PerModel[fmt.Sprintf("model-%04d", i)] = config.DimensionLimits{TokensPerMinute: 600000, TokensPerDay: 100000000}
	}
	doc, err := c.Render()
	if err != nil {
		tb.Fatal(err)
	}
	return doc
}

// reloadServer is a proxy on the memory store, as a replica of a memory fleet runs.
func reloadServer() (*server.Server, *metrics.Metrics) {
	m := metrics.New(prometheus.NewRegistry())
	mem := budget.NewMemory(budget.SystemClock{}, config.DefaultMaxBuckets)
	return server.New(server.Options{Store: mem, Memory: mem, Metrics: m,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), AccessLog: io.Discard}), m
}

// liveHeap is the heap in use after a collection.
func liveHeap() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// processTime is the CPU time the process has used, every goroutine's and the
// collector's: under a loaded machine it moves less than the wall time.
func processTime(tb testing.TB) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		tb.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkReload50k is a replica's reload of a fleet of 50,000 keys and 2,000
// budgets, the whole of Server.Apply (parse, validate, compile, swap in, prune): a
// fresh replica's first document ("first") and the next generation's on a replica
// already serving one ("next"); "parse" is the parse and validation alone. reload-ms is
// what the proxy reports as tokenwarden_config_last_reload_duration_seconds (wall
// time, as ns/op), cpu-ms the process's CPU time, and live-MiB the heap the server
// holds after a collection less what it held without a config: the config in force,
// and after "next" whatever an earlier one left.
func BenchmarkReload50k(b *testing.B) {
	const keys, budgets = 50000, 2000
	docs := [][]byte{fleetDoc(b, keys, budgets, 1), fleetDoc(b, keys, budgets, 2)}
	b.Run("parse", func(b *testing.B) {
		b.SetBytes(int64(len(docs[0])))
		b.ReportAllocs()
		n := 0
		began := processTime(b)
		for b.Loop() {
			n++
			if _, err := config.Parse(docs[0]); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64((processTime(b)-began).Milliseconds())/float64(n), "cpu-ms")
	})
	b.Run("first", func(b *testing.B) {
		b.SetBytes(int64(len(docs[0])))
		b.ReportAllocs()
		var reload float64
		var cpu time.Duration
		for range b.N {
			b.StopTimer()
			srv, m := reloadServer()
			b.StartTimer()
			began := processTime(b)
			if _, err := srv.Apply(docs[0], "bench"); err != nil {
				b.Fatal(err)
			}
			cpu += processTime(b) - began
			reload += testutil.ToFloat64(m.ConfigReloadTime)
		}
		b.StopTimer()
		b.ReportMetric(reload/float64(b.N)*1000, "reload-ms")
		b.ReportMetric(float64(cpu.Milliseconds())/float64(b.N), "cpu-ms")
		srv, _ := reloadServer()
		before := liveHeap()
		if _, err := srv.Apply(docs[0], "bench"); err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(liveHeap()-before)/(1<<20), "live-MiB")
		runtime.KeepAlive(srv)
	})
	b.Run("next", func(b *testing.B) {
		srv, m := reloadServer()
		before := liveHeap()
		if _, err := srv.Apply(docs[0], "bench"); err != nil {
			b.Fatal(err)
		}
		b.SetBytes(int64(len(docs[0])))
		b.ReportAllocs()
		var reload float64
		i := 0
		began := processTime(b)
		for b.Loop() {
			i++
			if _, err := srv.Apply(docs[i%2], "bench"); err != nil {
				b.Fatal(err)
			}
			reload += testutil.ToFloat64(m.ConfigReloadTime)
		}
		b.ReportMetric(reload/float64(i)*1000, "reload-ms")
		b.ReportMetric(float64((processTime(b)-began).Milliseconds())/float64(i), "cpu-ms")
		b.StopTimer()
		b.ReportMetric(float64(liveHeap()-before)/(1<<20), "live-MiB")
		runtime.KeepAlive(srv)
	})
}
