// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package lab_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tokenwarden/tokenwarden/test/lab"
)

// attempts is how many times a mission runs when the machine held its runs up: a
// scaled run on a busy machine measures the machine, not the proxy.
const attempts = 3

// mission runs a mission until none of its runs was disturbed, and fails on any check
// it missed; when every attempt was disturbed it skips, saying so.
func mission(t *testing.T, run func(context.Context, *lab.World) (*lab.Outcome, error)) *lab.Outcome {
	t.Helper()
	w, err := lab.LoadWorld("")
	if err != nil {
		t.Fatal(err)
	}
	for i := range attempts {
		o, err := run(t.Context(), w)
		if err != nil {
			t.Fatal(err)
		}
		disturbed := false
		for _, r := range o.Runs {
			disturbed = disturbed || r.Disturbed()
		}
		t.Logf("attempt %d:\n%s", i+1, lab.Table([]*lab.Outcome{o}))
		if disturbed {
			continue
		}
		for _, c := range o.Checks {
			if !c.OK {
				t.Errorf("%s: missed %q: got %s", o.Mission, c.Target, c.Got)
			}
		}
		return o
	}
	if os.Getenv("LAB_STRICT") != "" {
		t.Fatalf("the machine held every one of %d attempts up", attempts)
	}
	t.Skipf("the machine held every one of %d attempts up; the figures would measure it, not the proxy (LAB_STRICT=1 fails instead)", attempts)
	return nil
}

// The unlimited first-in-first-out run with the agent reproduces the world's figures
// (interactive p95 queue wait about 8 s, about 70% of chat starting within 2 s),
// and the request limit in place never triggers; with token limits the agent is capped
// and chat restored (mission one).
func TestCalibrationAndMissionOne(t *testing.T) {
	var calib *lab.Outcome
	mission(t, func(ctx context.Context, w *lab.World) (*lab.Outcome, error) {
		var err error
		calib, err = w.Calibration(ctx)
		return calib, err
	})
	mission(t, func(ctx context.Context, w *lab.World) (*lab.Outcome, error) {
		return w.MissionOne(ctx, calib.Runs[1])
	})
}

// The scheduler gives 5,000 batch output tokens per second and 99% of chat starting
// within 2 seconds at once (mission three), with the proxy's scheduling defaults: the
// world gives the upstream its capacity and the keys their classes, nothing else.
func TestMissionThree(t *testing.T) {
	w, err := lab.LoadWorld("")
	if err != nil {
		t.Fatal(err)
	}
	if doc := w.Document(w.MissionThreePolicy(), "http://backend"); strings.Contains(doc, "scheduling") {
		t.Fatalf("the lab's mission three sets scheduling knobs, want the proxy's defaults:\n%s", doc)
	}
	mission(t, func(ctx context.Context, w *lab.World) (*lab.Outcome, error) { return w.MissionThree(ctx, false) })
}

// The agent, the burst and heavy batch at once, every tenant with a token limit,
// through the scheduler (mission four).
func TestMissionFour(t *testing.T) {
	mission(t, func(ctx context.Context, w *lab.World) (*lab.Outcome, error) { return w.MissionFour(ctx) })
}

// The rule sizes the chat app's burst (1.5 requests/s, 2.5 times that for 30 s, 200,000
// tokens/min) at the 42,000 tokens or so that the arithmetic by hand gives, and a
// bucket of the rule's size refuses far fewer of the burst's requests than half of it.
func TestSizing(t *testing.T) {
	tr := lab.Traffic{Rate: 1.5, BurstMultiplier: 2.5, BurstSeconds: 30, Prompt: 900, Answer: 250, MaxTokens: 1024, Duration: 4, TokensPerMinute: 200000}
	s := lab.Size(tr)
	if s.Tokens < 39000 || s.Tokens > 43000 {
		t.Errorf("the rule gives %.0f tokens for the chat app's burst; the arithmetic by hand gives about 42,000", s.Tokens)
	}
	var half, full float64
	for seed := range uint64(20) {
		half += lab.SimulateBucket(tr, s.Tokens/2, seed)
		full += lab.SimulateBucket(tr, s.Tokens*1.5, seed)
	}
	if full >= half/4 {
		t.Errorf("one and a half times the rule's bucket refuses %.1f%% of the burst, half of it %.1f%%", 100*full/20, 100*half/20)
	}
	if err := (lab.Traffic{Rate: 1, BurstMultiplier: 2, Prompt: 10, Answer: 20, MaxTokens: 10, TokensPerMinute: 1}).Validate(); err == nil || !strings.Contains(err.Error(), "max-tokens") {
		t.Errorf("max_tokens below the answer: got %v, want an error naming max-tokens", err)
	}
}

// A world with a mistake is refused with the field named.
func TestWorldErrors(t *testing.T) {
	world := string(lab.DefaultWorld)
	for _, c := range []struct{ from, to, field string }{
		{"duration_seconds: 120", "duration_seconds: 0", "duration_seconds"},
		{"kind: batch, class: batch", "kind: robot, class: batch", "tenants[4].kind"},
		{"kv_tokens:", "kv_tokenz:", "kv_tokenz"},
		{"scheduler: {", "scheduler: {aging_seconds: -1, ", "scheduler.aging_seconds"},
	} {
		_, err := lab.ParseWorld([]byte(strings.Replace(world, c.from, c.to, 1)))
		if err == nil || !strings.Contains(err.Error(), c.field) {
			t.Errorf("%s: got %v, want an error naming %s", c.to, err, c.field)
		}
	}
}

// The charts and the table are written as self-contained pages: the stacked work, the
// capacity line, the waiting line and the 429 labels, and the mission's checks.
func TestWrite(t *testing.T) {
	w, err := lab.LoadWorld("")
	if err != nil {
		t.Fatal(err)
	}
	s := time.Second
	r := &lab.Result{Policy: lab.Policy{Name: "a run"}, World: w, End: 10 * s,
		Records: []lab.Record{
			{Tenant: "app-books", Kind: lab.KindChat, Sent: s, Started: 4 * s, Arrived: s, Status: 200, In: 900, Out: 250},
			{Tenant: "agent", Kind: lab.KindAgent, Sent: 2 * s, Started: -1, Arrived: -1, Status: 429, In: 9000, Out: 1000},
		},
		Steps: []lab.RunStep{{Start: 4 * s, End: 5 * s, Sequences: map[string]int{"app-books": 1},
			Generated: map[string]int64{"app-books": 1}, Context: map[string]int64{"app-books": 1150}}},
	}
	o := &lab.Outcome{Mission: "mission zero", Question: "does it draw", Runs: []*lab.Result{r},
		Checks: []lab.Check{{Target: "a target", Got: "a figure", OK: false}}}
	dir := t.TempDir()
	files, err := lab.Write(dir, w, []*lab.Outcome{o})
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != 3 {
		t.Fatalf("wrote %v, want a run's page, index.html and missions.txt", files)
	}
	index, _ := os.ReadFile(filepath.Join(dir, "index.html"))
	for _, want := range []string{"<svg", "capacity 600k tokens", "429×1", "waiting (right axis)", "mission zero", "a target", "missed", "<polygon"} {
		if !strings.Contains(string(index), want) {
			t.Errorf("index.html lacks %q", want)
		}
	}
	text, _ := os.ReadFile(filepath.Join(dir, "missions.txt"))
	if !strings.Contains(string(text), "FAIL a target: a figure") || !strings.Contains(string(text), "MISSED") {
		t.Errorf("missions.txt:\n%s", text)
	}
}
