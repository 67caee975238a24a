// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package server_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/proxy/budget/redisstore"
	"github.com/tokenwarden/tokenwarden/proxy/metrics"
	"github.com/tokenwarden/tokenwarden/proxy/server"
	"github.com/tokenwarden/tokenwarden/test/redisserver"
)

// heldDoc is the limits' six dimensions on both periods (twelve token buckets), no
// request-count limits and no limit rules.
const heldDoc = `
upstreams: [{name: default, url: UPSTREAM}]
api_keys:
- {name: alice, key_sha256: HASH, user: alice, team: research}
rate_limiting:
  storage: redis
  redis: {url: "REDIS"}
  budget_division: {replicas: 1}
  limits:
    global:      {tokens_per_minute: 1000000000000, tokens_per_day: 1000000000000}
    per_client:  {tokens_per_minute: 1000000000000, tokens_per_day: 1000000000000}
    per_api_key: {tokens_per_minute: 1000000000000, tokens_per_day: 1000000000000}
    per_user:    {tokens_per_minute: 1000000000000, tokens_per_day: 1000000000000}
    per_team:    {tokens_per_minute: 1000000000000, tokens_per_day: 1000000000000}
    per_model:
      gpt-4o:    {tokens_per_minute: 1000000000000, tokens_per_day: 1000000000000}
`

// heldTogether is how many requests each round holds at the upstream at once.
const heldTogether = 50

// settleCounter counts the settlements the Redis store has applied.
type settleCounter struct {
	budget.NopRecorder
	n atomic.Int64
}

// RedisPipeline implements budget.Recorder.
func (c *settleCounter) RedisPipeline(_ time.Duration, _, refunds, charges int) {
	c.n.Add(int64(refunds + charges))
}

// BenchmarkProxyHeld is Redis' own cost of a request through the whole proxy in Redis
// mode when requests come together: each round sends 50 requests at once, a slow
// upstream holds every one until all 50 have arrived (so all are admitted together),
// then answers them, and the round ends when their settlements have reached Redis.
// One op is one request. It reports, from INFO commandstats and INFO cpu, the script
// calls per request, Redis' time in the scripts per request (admission plus
// settlement: evalsha usec), and the CPU the redis-server process used per request
// (user and system, which a loaded host inflates less than the script time).
func BenchmarkProxyHeld(b *testing.B) {
	var mu sync.Mutex
	arrived, release := 0, make(chan struct{})
	body := []byte(`{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hello"}}],"usage":{"prompt_tokens":20,"completion_tokens":5}}`)
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		mu.Lock()
		gate := release
		if arrived++; arrived == heldTogether {
			arrived, release = 0, make(chan struct{})
			close(gate)
		}
		mu.Unlock()
		<-gate
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(body)
	}))
	defer backend.Close()

	rs := redisserver.Start(b)
	settlements := &settleCounter{}
	store, err := redisstore.New(redisstore.Options{URL: rs.URL(), Recorder: settlements, DialTimeout: time.Second,
		ReadTimeout: time.Second, WriteTimeout: time.Second})
	if err != nil {
		b.Fatal(err)
	}
	defer store.Close()
	srv := server.New(server.Options{Store: store, Memory: budget.NewMemory(budget.SystemClock{}, 1000),
		Metrics: metrics.New(prometheus.NewRegistry()), AsyncSettle: true,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), AccessLog: io.Discard})
	doc := strings.NewReplacer("UPSTREAM", backend.URL, "HASH", keyHash("sk-alice"), "REDIS", rs.URL()).Replace(heldDoc)
	if _, err := srv.Apply([]byte(doc), "bench"); err != nil {
		b.Fatal(err)
	}
	front := httptest.NewServer(srv)
	defer front.Close()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: heldTogether, MaxIdleConns: heldTogether}}
	round := func() {
		var wg sync.WaitGroup
		for range heldTogether {
			wg.Add(1)
			go func() {
				defer wg.Done()
				req, _ := http.NewRequest("POST", front.URL+"/v1/chat/completions", strings.NewReader(benchRequest))
				req.Header.Set("Authorization", "Bearer sk-alice")
				req.Header.Set("Content-Type", "application/json")
				resp, err := client.Do(req)
				if err != nil {
					b.Error(err)
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					b.Errorf("status %d", resp.StatusCode)
				}
			}()
		}
		wg.Wait()
	}
	ctx := context.Background()
	rc := store.Client()
	// The settlements of a round reach Redis after its responses: a round is over
	// when Redis has applied every request's settlement (a refund, or a charge).
	settled := func(want int64) {
		for settlements.n.Load() < want {
			time.Sleep(200 * time.Microsecond)
		}
	}
	round() // load the scripts, create the keys
	settled(heldTogether)
	cpu := func() float64 {
		sec, err := redisserver.CPUSeconds(ctx, rc)
		if err != nil {
			b.Fatal(err)
		}
		return sec
	}
	if err := rc.ConfigResetStat(ctx).Err(); err != nil {
		b.Fatal(err)
	}
	cpu0 := cpu()
	rounds := 0
	b.ResetTimer()
	for done := 0; done < b.N; done += heldTogether {
		round()
		rounds++
		settled(int64((rounds + 1) * heldTogether))
	}
	b.StopTimer()
	requests := float64(rounds * heldTogether)
	cpuSec := cpu() - cpu0
	n, usec, err := redisserver.Commandstat(ctx, rc, "evalsha")
	if err != nil {
		b.Fatal(err)
	}
	calls := float64(n)
	b.ReportMetric(calls/requests, "calls/request")
	b.ReportMetric(usec/requests, "redis-µs/request")
	b.ReportMetric(cpuSec*1e6/requests, "redis-cpu-µs/request")
}
