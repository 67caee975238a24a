// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package server_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// BenchmarkOpenLoop is the latency the proxy adds at a fixed load below saturation:
// an open loop of OPENLOOP_RPS requests a second (1,000) for OPENLOOP_SECONDS (10),
// each sent at its time whether or not the ones before it were answered, straight to
// the backend and through the proxy enforcing every dimension (benchDoc). A request's
// latency runs from the time it was due, so a stall counts in full. One run is one
// loop, whatever b.N: run it with -benchtime 1x (make bench-openloop).
func BenchmarkOpenLoop(b *testing.B) {
	rps, secs := envInt("OPENLOOP_RPS", 1000), envInt("OPENLOOP_SECONDS", 10)
	backend := benchBackend()
	defer backend.Close()
	tw := httptest.NewServer(newBenchServer(b, backend.URL))
	defer tw.Close()
	for _, c := range []struct{ name, url string }{{"direct", backend.URL}, {"tokenwarden-memory", tw.URL}} {
		b.Run(c.name, func(b *testing.B) {
			openLoop(b, c.url, rps, secs)
		})
	}
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// openLoop sends rps requests a second for secs seconds to target, after a second of
// warm-up at the same rate that opens the connections, and reports the latencies'
// p50, p99 and maximum.
func openLoop(b *testing.B, target string, rps, secs int) {
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 512, MaxIdleConns: 512}}
	defer client.CloseIdleConnections()
	run := func(n int) []time.Duration {
		every := time.Second / time.Duration(rps)
		lat := make([]time.Duration, n)
		var wg sync.WaitGroup
		var failed atomic.Int64
		start := time.Now()
		for i := range n {
			due := start.Add(time.Duration(i) * every)
			if d := time.Until(due); d > 0 {
				time.Sleep(d)
			}
			wg.Go(func() {
				if !sendChat(client, target) {
					failed.Add(1)
				}
				lat[i] = time.Since(due)
			})
		}
		wg.Wait()
		if f := failed.Load(); f > 0 {
			b.Fatalf("%d requests failed", f)
		}
		return lat
	}
	run(rps)
	b.ResetTimer()
	lat := run(rps * secs)
	b.StopTimer()
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
	b.ReportMetric(float64(lat[len(lat)-1].Microseconds()), "max-µs")
}

// sendChat sends the benchmark's chat request and reports whether it was answered 200.
func sendChat(client *http.Client, target string) bool {
	req, _ := http.NewRequest("POST", target+"/v1/chat/completions", strings.NewReader(benchRequest))
	req.Header.Set("Authorization", "Bearer sk-alice")
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return false
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}
