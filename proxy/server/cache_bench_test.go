// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package server_test

import (
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/tokenwarden/tokenwarden/proxy/server"
)

// BenchmarkHandlerCache is BenchmarkHandler with the response cache off, configured
// and missing (every body is new: the lookup, the coalescing group's join and the
// store of the answer are the cost), and hit (one body: no backend call).
func BenchmarkHandlerCache(b *testing.B) {
	backend := benchBackend()
	defer backend.Close()
	cached := benchDoc + "cache: {storage: memory}\n"
	var seq atomic.Int64
	distinct := func() string {
		n := strconv.FormatInt(seq.Add(1), 10)
		return strings.Replace(benchRequest, "three sentences", "three sentences ("+n+")", 1)
	}
	same := func() string { return benchRequest }
	for _, c := range []struct {
		name string
		doc  string
		body func() string
	}{{"off", benchDoc, distinct}, {"miss", cached, distinct}, {"hit", cached, same}} {
		b.Run(c.name, func(b *testing.B) {
			benchCacheOn(b, newBenchServerDoc(b, backend.URL, c.doc), c.body)
		})
	}
}

// benchCacheOn is benchHandlerOn with a body of the caller's for each request.
func benchCacheOn(b *testing.B, srv *server.Server, body func() string) {
	b.ReportAllocs()
	b.ResetTimer()
	cpu := processCPU()
	defer func() {
		if cpu := processCPU() - cpu; cpu > 0 && b.N > 0 {
			b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N)/1000, "cpu-µs/op")
		}
	}()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			req := httptest.NewRequest("POST", "/v1/chat/completions", strings.NewReader(body()))
			req.Header.Set("Authorization", "Bearer sk-alice")
			w := httptest.NewRecorder()
			srv.ServeHTTP(w, req)
			if w.Code != 200 {
				b.Fatalf("status %d", w.Code)
			}
		}
	})
}
