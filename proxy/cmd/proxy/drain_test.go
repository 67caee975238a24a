// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bufio"
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/proxy/budget/storetest"
	"github.com/tokenwarden/tokenwarden/proxy/metrics"
	"github.com/tokenwarden/tokenwarden/proxy/server"
	"github.com/tokenwarden/tokenwarden/test/fakellm"
)

// A stopping proxy fails its readiness, refuses new connections, lets the stream in
// flight finish and settles its hold before it returns.
func TestDrainFinishesStreamsAndSettles(t *testing.T) {
	fake := fakellm.New()
	fake.Set(fakellm.Behaviour{InputTokens: 10, OutputTokens: 20, ChunkDelay: 60 * time.Millisecond}) // a 1.2 s stream
	upstream := httptest.NewServer(fake)
	defer upstream.Close()

	doc := `
upstreams: [{name: llm, url: '` + upstream.URL + `'}]
auth: {mode: optional}
rate_limiting:
  budget_division: {replicas: 1}
  limits:
    global: {tokens_per_day: 1000}
`
	clock := storetest.NewClock() // fixed: the day bucket does not refill during the test
	mem := budget.NewMemory(clock, 1000)
	reg := prometheus.NewRegistry()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	srv := server.New(server.Options{Store: mem, Memory: mem, Metrics: metrics.New(reg), Clock: clock, Logger: log})
	if _, err := srv.Apply([]byte(doc), "test"); err != nil {
		t.Fatal(err)
	}
	lnData, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	lnAdmin, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, sigterm := context.WithCancel(context.Background())
	defer sigterm()
	served := make(chan error, 1)
	go func() {
		served <- serve(ctx, log, srv, srv.AdminHandler(reg), lnData, lnAdmin, drainOptions{delay: 300 * time.Millisecond, timeout: 20 * time.Second})
	}()
	readyz := func() int {
		resp, err := http.Get("http://" + lnAdmin.Addr().String() + "/readyz")
		if err != nil {
			return 0
		}
		_ = resp.Body.Close()
		return resp.StatusCode
	}
	if code := readyz(); code != http.StatusOK {
		t.Fatalf("/readyz before the drain: %d", code)
	}

	body := `{"model":"m","stream":true,"stream_options":{"include_usage":true},"max_tokens":100,"messages":[{"role":"user","content":"hi"}]}`
	resp, err := http.Post("http://"+lnData.Addr().String()+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	stream := bufio.NewReader(resp.Body)
	if _, err := stream.ReadString('\n'); err != nil {
		t.Fatalf("first event: %v", err)
	}
	if level, _ := mem.Level(budget.Key{Kind: budget.TokensDay, Dim: budget.Global}); level >= 1000-100 {
		t.Fatalf("the stream holds no reservation: level %v", level)
	}

	sigterm() // SIGTERM mid-stream
	deadline := time.Now().Add(2 * time.Second)
	for readyz() != http.StatusServiceUnavailable {
		if time.Now().After(deadline) {
			t.Fatal("/readyz does not answer 503 while draining")
		}
		time.Sleep(10 * time.Millisecond)
	}
	for {
		c, err := net.DialTimeout("tcp", lnData.Addr().String(), time.Second)
		if err != nil {
			break // new connections are refused once the listener closes
		}
		_ = c.Close()
		if time.Now().After(deadline) {
			t.Fatal("the listener still accepts new connections during the drain")
		}
		time.Sleep(20 * time.Millisecond)
	}

	rest, err := io.ReadAll(stream)
	if err != nil {
		t.Fatalf("the stream in flight was cut: %v", err)
	}
	if !strings.Contains(string(rest), "data: [DONE]") {
		t.Fatalf("the stream did not reach its end: %q", rest)
	}
	select {
	case err := <-served:
		if err != nil {
			t.Fatalf("serve: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the drain did not end after the last stream")
	}
	level, ok := mem.Level(budget.Key{Kind: budget.TokensDay, Dim: budget.Global})
	if !ok || level != 1000-30 {
		t.Fatalf("global day bucket at %v (exists %v), want 970: the hold settled on the stream's usage (10 in, 20 out)", level, ok)
	}
}
