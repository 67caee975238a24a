// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package upstream_test

import (
	"io"
	"log/slog"
	"net/http"
	"testing"
	"time"

	"github.com/tokenwarden/tokenwarden/proxy/config"
	"github.com/tokenwarden/tokenwarden/proxy/health"
	"github.com/tokenwarden/tokenwarden/proxy/refusal"
	"github.com/tokenwarden/tokenwarden/proxy/upstream"
)

var now = time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)

// model is a registered model served by the upstreams named, in order; "anthropic:"
// before a name makes it speak only that API.
func model(names ...string) *upstream.Model {
	h := health.NewRegistry()
	m := &upstream.Model{Name: "gpt-4o"}
	for _, n := range names {
		up := &upstream.Upstream{Name: n, CredKey: "upstream:" + n}
		if len(n) > 10 && n[:10] == "anthropic:" {
			up.Name, up.Provider = n[10:], config.ProviderAnthropic
		}
		up.Breaker, up.Cooldown = h.Breaker(up.Name), h.Cooldown(up.CredKey)
		m.Candidates = append(m.Candidates, upstream.Candidate{Up: up, Header: []string{up.Name}})
	}
	return m
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func TestPickSkipsAnotherFamilyAndACoolingCredential(t *testing.T) {
	m := model("anthropic:claude", "primary", "secondary")
	m.Candidates[1].Up.Cooldown.Start(now, 30*time.Second)
	i, more, _ := m.Pick(0, refusal.OpenAI, now, true)
	if i != 2 || more {
		t.Fatalf("picked %d (more %v), want the secondary (2), with none after it", i, more)
	}
	m.Candidates[2].Up.Cooldown.Start(now, 10*time.Second)
	i, _, at := m.Pick(0, refusal.OpenAI, now, false)
	if i != -1 || !at.Equal(now.Add(10*time.Second)) {
		t.Fatalf("with every OpenAI candidate cooling: picked %d, earliest %v; want none, in 10 s", i, at)
	}
	if i, _, _ := m.Pick(0, refusal.Anthropic, now, false); i != 0 {
		t.Fatalf("an Anthropic request picked %d, want the claude upstream (0)", i)
	}
}

func TestAttemptFailsOverOnceToEachNextCandidate(t *testing.T) {
	m := model("primary", "secondary")
	a := &upstream.Attempt{Model: m}
	c, _ := a.Next(refusal.OpenAI, now)
	if c == nil || c.Up.Name != "primary" {
		t.Fatalf("the first attempt went to %v, want primary", c)
	}
	if !a.Answered(http.StatusServiceUnavailable, http.Header{}, nil, now, quiet) || !a.Retry() {
		t.Fatal("a 503 with another candidate left is not dropped for the next one")
	}
	c, _ = a.Next(refusal.OpenAI, now)
	if c == nil || c.Up.Name != "secondary" {
		t.Fatalf("the failover went to %v, want secondary", c)
	}
	if a.Answered(http.StatusServiceUnavailable, http.Header{}, nil, now, quiet) {
		t.Fatal("the last candidate's 503 is dropped, with no candidate to take the request")
	}
	if c, at := a.Next(refusal.OpenAI, now); c != nil || !at.IsZero() {
		t.Fatalf("after the last candidate: %v, %v; want none", c, at)
	}
}

func TestAnswered429CoolsTheCredential(t *testing.T) {
	m := model("primary", "secondary")
	a := &upstream.Attempt{Model: m}
	a.Next(refusal.OpenAI, now)
	h := http.Header{}
	h.Set("Retry-After", "20")
	if !a.Answered(http.StatusTooManyRequests, h, nil, now, quiet) {
		t.Fatal("a 429 with another candidate left is not dropped")
	}
	if until := m.Candidates[0].Up.Cooldown.Until(); !until.After(now) {
		t.Fatalf("the primary's credential cools until %v, want after %v", until, now)
	}
	if i, _, _ := m.Pick(0, refusal.OpenAI, now, false); i != 1 {
		t.Fatalf("a request after the 429 picked %d, want the secondary (1)", i)
	}
}

func TestFailedClientGoneIsNotTheUpstreamsFault(t *testing.T) {
	m := model("primary", "secondary")
	a := &upstream.Attempt{Model: m}
	a.Next(refusal.OpenAI, now)
	if a.Failed(io.ErrUnexpectedEOF, true, now) {
		t.Fatal("a client that went away is failed over")
	}
	a = &upstream.Attempt{Model: m}
	a.Next(refusal.OpenAI, now)
	if !a.Failed(io.ErrUnexpectedEOF, false, now) {
		t.Fatal("an upstream that broke off is not failed over to the next candidate")
	}
}

func TestOverLimit(t *testing.T) {
	m := &upstream.Model{Window: 1000, MaxOut: 300}
	for _, c := range []struct {
		in, out int64
		want    string
	}{
		{100, 200, ""},
		{100, 301, upstream.LimitModelOutput},
		{800, 201, upstream.LimitContextWindow},
		{1001, 0, upstream.LimitContextWindow},
	} {
		if got := m.OverLimit(c.in, c.out); got != c.want {
			t.Errorf("input %d, output %d: %q, want %q", c.in, c.out, got, c.want)
		}
	}
}
