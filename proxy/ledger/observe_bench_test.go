// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package ledger_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/proxy/ledger"
	"github.com/tokenwarden/tokenwarden/proxy/metrics"
	"github.com/tokenwarden/tokenwarden/proxy/server"
	"github.com/tokenwarden/tokenwarden/proxy/settlement"
)

const benchDoc = `
upstreams: [{name: default, url: UPSTREAM}]
models: [{name: gpt-4o, price: {input: 2.5, output: 10}}]
api_keys:
- {name: alice, key_sha256: HASH, user: alice, team: research}
rate_limiting:
  budget_division: {replicas: 1}
  limits:
    per_api_key: {requests_per_second: 1000000000, tokens_per_minute: 1000000000000, tokens_per_day: 1000000000000}
`

const benchRequest = `{"model":"gpt-4o","max_tokens":256,"messages":[{"role":"user","content":"Summarise the plot of a long novel in three sentences, please."}]}`

// BenchmarkSettledRequest is one whole request through the proxy's handler (a
// loopback backend, a priced model), with the ledger's observer off and on: on, every
// settlement is added to a ledger that flushes every second to SQLite, as a
// standalone proxy's does. cpu-µs/op is the process's CPU per request, flushes
// included. -count runs each half that many times in a row: for rounds that
// interleave, run the binary once per round (docs/ledger.md).
func BenchmarkSettledRequest(b *testing.B) {
	body := []byte(`{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hello"}}],"usage":{"prompt_tokens":20,"completion_tokens":5}}`)
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(body)
	}))
	defer backend.Close()
	for _, on := range []bool{false, true} {
		name := "ledger=off"
		if on {
			name = "ledger=on"
		}
		b.Run(name, func(b *testing.B) {
			var observers []settlement.Observer
			if on {
				sink, err := ledger.Open(context.Background(), "sqlite:"+filepath.Join(b.TempDir(), "ledger.db"))
				if err != nil {
					b.Fatal(err)
				}
				defer sink.Close()
				l, err := ledger.New(ledger.Config{Sink: sink, Pod: "bench", FlushInterval: time.Second})
				if err != nil {
					b.Fatal(err)
				}
				defer func() { _ = l.Close(context.Background()) }()
				observers = append(observers, &ledger.Observer{Ledger: l, Fleet: "llm/fleet"})
			}
			srv := server.New(server.Options{Store: budget.NewMemory(budget.SystemClock{}, 1000000), Metrics: metrics.New(prometheus.NewRegistry()),
				Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), AccessLog: io.Discard, Observers: observers})
			doc := strings.ReplaceAll(strings.ReplaceAll(benchDoc, "UPSTREAM", backend.URL), "HASH", sha("sk-alice"))
			if _, err := srv.Apply([]byte(doc), "bench"); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			b.ResetTimer()
			cpu := processCPU()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					req := httptest.NewRequest("POST", "/v1/chat/completions", strings.NewReader(benchRequest))
					req.Header.Set("Authorization", "Bearer sk-alice")
					w := httptest.NewRecorder()
					srv.ServeHTTP(w, req)
					if w.Code != http.StatusOK {
						b.Errorf("status %d: %s", w.Code, w.Body.String())
						return
					}
				}
			})
			if d := processCPU() - cpu; d > 0 && b.N > 0 {
				b.ReportMetric(float64(d.Nanoseconds())/float64(b.N)/1000, "cpu-µs/op")
			}
		})
	}
}

func processCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
