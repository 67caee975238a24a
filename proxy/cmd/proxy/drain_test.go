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

// drainHarness is a proxy served as the binary serves it, in front of a fake upstream
// whose streams carry 20 deltas of chunkDelay each, with a global day budget of 1000
// on a clock that does not move (the bucket does not refill during a test).
type drainHarness struct {
	mem            *budget.Memory
	lnData, lnAdmn net.Listener
	served         chan error
	sigterm        context.CancelFunc
}

func newDrainHarness(t *testing.T, chunkDelay time.Duration, o drainOptions) *drainHarness {
	t.Helper()
	fake := fakellm.New()
	fake.Set(fakellm.Behaviour{InputTokens: 10, OutputTokens: 20, ChunkDelay: chunkDelay})
	upstream := httptest.NewServer(fake)
	t.Cleanup(upstream.Close)
	doc := `
upstreams: [{name: llm, url: '` + upstream.URL + `'}]
auth: {mode: optional}
rate_limiting:
  budget_division: {replicas: 1}
  limits:
    global: {tokens_per_day: 1000}
`
	clock := storetest.NewClock()
	h := &drainHarness{mem: budget.NewMemory(clock, 1000), served: make(chan error, 1)}
	reg := prometheus.NewRegistry()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	srv := server.New(server.Options{Store: h.mem, Memory: h.mem, Metrics: metrics.New(reg), Clock: clock, Logger: log})
	if _, err := srv.Apply([]byte(doc), "test"); err != nil {
		t.Fatal(err)
	}
	var err error
	if h.lnData, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	if h.lnAdmn, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	ctx, sigterm := context.WithCancel(context.Background())
	t.Cleanup(sigterm)
	h.sigterm = sigterm
	go func() { h.served <- serve(ctx, log, srv, srv.AdminHandler(reg), h.lnData, h.lnAdmn, o) }()
	return h
}

func (h *drainHarness) readyz() int {
	resp, err := http.Get("http://" + h.lnAdmn.Addr().String() + "/readyz")
	if err != nil {
		return 0
	}
	_ = resp.Body.Close()
	return resp.StatusCode
}

// startStream sends a streamed chat request and reads its first event.
func (h *drainHarness) startStream(t *testing.T) (*bufio.Reader, func()) {
	t.Helper()
	body := `{"model":"m","stream":true,"stream_options":{"include_usage":true},"max_tokens":100,"messages":[{"role":"user","content":"hi"}]}`
	resp, err := http.Post("http://"+h.lnData.Addr().String()+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	stream := bufio.NewReader(resp.Body)
	if _, err := stream.ReadString('\n'); err != nil {
		t.Fatalf("first event: %v", err)
	}
	return stream, func() { _ = resp.Body.Close() }
}

func (h *drainHarness) level() float64 {
	l, _ := h.mem.Level(budget.Key{Kind: budget.TokensDay, Dim: budget.Global})
	return l
}

func (h *drainHarness) waitServed(t *testing.T) {
	t.Helper()
	select {
	case err := <-h.served:
		if err != nil {
			t.Fatalf("serve: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the drain did not end")
	}
}

// A stopping proxy fails its readiness, refuses new connections, lets the stream in
// flight finish and settles its hold before it returns.
func TestDrainFinishesStreamsAndSettles(t *testing.T) {
	h := newDrainHarness(t, 60*time.Millisecond, drainOptions{delay: 300 * time.Millisecond, timeout: 20 * time.Second}) // a 1.2 s stream
	if code := h.readyz(); code != http.StatusOK {
		t.Fatalf("/readyz before the drain: %d", code)
	}
	stream, closeStream := h.startStream(t)
	defer closeStream()
	if h.level() >= 1000-100 {
		t.Fatalf("the stream holds no reservation: level %v", h.level())
	}

	h.sigterm() // SIGTERM mid-stream
	deadline := time.Now().Add(2 * time.Second)
	for h.readyz() != http.StatusServiceUnavailable {
		if time.Now().After(deadline) {
			t.Fatal("/readyz does not answer 503 while draining")
		}
		time.Sleep(10 * time.Millisecond)
	}
	for {
		c, err := net.DialTimeout("tcp", h.lnData.Addr().String(), time.Second)
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
	h.waitServed(t)
	if level := h.level(); level != 1000-30 {
		t.Fatalf("global day bucket at %v, want 970: the hold settled on the stream's usage (10 in, 20 out)", level)
	}
}

// A stream that outlasts the drain timeout is cut, and its hold still settles on what
// it carried: neither released nor left at its reservation.
func TestDrainCutsWhatOutlastsItsTimeoutAndSettles(t *testing.T) {
	h := newDrainHarness(t, 200*time.Millisecond, drainOptions{timeout: 500 * time.Millisecond}) // a 4 s stream
	_, closeStream := h.startStream(t)
	defer closeStream()
	held := h.level()
	if held >= 1000-100 {
		t.Fatalf("the stream holds no reservation: level %v", held)
	}
	h.sigterm()
	h.waitServed(t)
	if level := h.level(); level <= held || level >= 1000 {
		t.Fatalf("global day bucket at %v after the cut, want between the reservation's %v and 1000: settled on the deltas carried", level, held)
	}
}
