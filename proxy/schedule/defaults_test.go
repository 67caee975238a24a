// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package schedule_test

import (
	"errors"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/tokenwarden/tokenwarden/proxy/config"
	"github.com/tokenwarden/tokenwarden/proxy/schedule"
)

// A backend at capacity with a heavy batch backlog: four chat apps at 1.5 requests/s
// (900-token prompts reserving 1,024 output tokens, 250 used, 4.5 s each) and a batch
// job at 7 requests/s (4,000-token prompts, 1,000 output tokens, 18 s each), more
// than the capacity of 256 requests and 600,000 tokens runs.
const (
	missionSeconds   = 120
	chatRun          = 4500 * time.Millisecond
	batchRun         = 18 * time.Second
	batchOutput      = 1000
	interactiveStart = 2 * time.Second
)

// missionThree returns the world's requests for 120 s, Poisson arrivals with a fixed
// seed, in arrival order.
func missionThree() []simRequest {
	var reqs []simRequest
	add := func(seed uint64, rate float64, mk func(at time.Duration) simRequest) {
		rng := rand.New(rand.NewPCG(3, seed))
		for at := rng.ExpFloat64() / rate; at < missionSeconds; at += rng.ExpFloat64() / rate {
			reqs = append(reqs, mk(time.Duration(at*float64(time.Second))))
		}
	}
	for i, app := range []string{"app-books", "app-search", "app-support", "app-orders"} {
		add(uint64(i), 1.5, func(at time.Duration) simRequest {
			return simRequest{at: at, run: chatRun, used: 250,
				r: schedule.Request{Tenant: app, Class: schedule.Interactive, Input: 900, Output: 1024}}
		})
	}
	add(4, 7, func(at time.Duration) simRequest {
		return simRequest{at: at, run: batchRun, used: batchOutput,
			r: schedule.Request{Tenant: "catalogue", Class: schedule.Batch, Input: 4000, Output: 1024}}
	})
	slices.SortFunc(reqs, func(a, b simRequest) int { return int(a.at - b.at) })
	return reqs
}

// defaultOptions are the scheduler's options for a fleet configured with only an
// upstream's capacity and its keys' classes.
func defaultOptions(t *testing.T) schedule.Options {
	t.Helper()
	c, err := config.Parse([]byte(`
upstreams:
- {name: backend, url: "http://127.0.0.1:8000", capacity: {max_in_flight_requests: 256, max_in_flight_tokens: 600000}}
api_keys:
- {name: app-books, key_sha256: 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08, priority: interactive}
- {name: catalogue, key_sha256: 60303ae22b998861bce3b28f33eec1be758a213c86c93c076dbe9f558c11c752, priority: batch}
`))
	if err != nil {
		t.Fatal(err)
	}
	return schedule.OptionsFor(c.Upstreams[0].Capacity, &c.Scheduling)
}

// TestDefaultsMeetMissionThree is the lab's mission three at the scheduler, on a
// simulated clock: with only a capacity and the keys' classes configured, 99% of chat
// requests start within 2 seconds while the batch job keeps 5,000 output tokens per
// second.
func TestDefaultsMeetMissionThree(t *testing.T) {
	reqs := missionThree()
	out := newSim(t, defaultOptions(t)).run(reqs, (missionSeconds+30)*time.Second)
	chat, within, timedOut := 0, 0, 0
	var batchTokens float64
	var worst time.Duration
	for i, r := range reqs {
		o := out[i]
		switch r.r.Class {
		case schedule.Interactive:
			chat++
			if o.started && o.wait <= interactiveStart {
				within++
			}
			if o.started {
				worst = max(worst, o.wait)
			}
		case schedule.Batch:
			if errors.Is(o.err, schedule.ErrQueueTimeout) {
				timedOut++
			}
			if o.started {
				// The output generated within the 120 s, at an even pace over its run.
				from := r.at + o.wait
				in := min(from+r.run, missionSeconds*time.Second) - from
				batchTokens += batchOutput * max(0, in.Seconds()) / r.run.Seconds()
			}
		}
	}
	share := float64(within) / float64(chat)
	perSecond := batchTokens / missionSeconds
	t.Logf("%d chat requests, %.1f%% started within %v (longest wait %v); batch %.0f output tokens/s, %d batch requests past their longest wait",
		chat, 100*share, interactiveStart, worst, perSecond, timedOut)
	if share < 0.99 {
		t.Errorf("%.1f%% of chat requests started within %v, want at least 99%% (longest wait %v)", 100*share, interactiveStart, worst)
	}
	if perSecond < 5000 {
		t.Errorf("batch got %.0f output tokens/s, want at least 5,000", perSecond)
	}
}

// TestDefaultsNeverStarveLowerClasses: interactive work arriving at three times what
// the capacity runs, for a minute, keeps the queue full; with the defaults batch still
// gets its 10% of what the capacity runs and background its 5%, interactive the rest.
func TestDefaultsNeverStarveLowerClasses(t *testing.T) {
	c, err := config.Parse([]byte(`
upstreams:
- {name: backend, url: "http://127.0.0.1:8000", capacity: {max_in_flight_requests: 20, max_in_flight_tokens: 40000}}
`))
	if err != nil {
		t.Fatal(err)
	}
	const seconds, run = 60, 2 * time.Second
	var reqs []simRequest
	for i, f := range []struct {
		class schedule.Class
		rate  float64
	}{{schedule.Interactive, 30}, {schedule.Batch, 5}, {schedule.Background, 5}} {
		rng := rand.New(rand.NewPCG(3, uint64(i)))
		for at := rng.ExpFloat64() / f.rate; at < seconds; at += rng.ExpFloat64() / f.rate {
			reqs = append(reqs, simRequest{at: time.Duration(at * float64(time.Second)), run: run, used: 1000,
				r: schedule.Request{Tenant: f.class.String(), Class: f.class, Input: 1000, Output: 1000}})
		}
	}
	slices.SortFunc(reqs, func(a, b simRequest) int { return int(a.at - b.at) })
	out := newSim(t, schedule.OptionsFor(c.Upstreams[0].Capacity, &c.Scheduling)).run(reqs, seconds*time.Second)
	// The capacity runs 20 requests of 2 s: 10 a second, 600 in the minute.
	var started [3]int
	for i, r := range reqs {
		if out[i].started {
			started[r.r.Class]++
		}
	}
	t.Logf("started in the minute: interactive %d, batch %d, background %d", started[0], started[1], started[2])
	for _, w := range []struct {
		class    schedule.Class
		min, max int
	}{{schedule.Interactive, 480, 520}, {schedule.Batch, 55, 65}, {schedule.Background, 28, 35}} {
		if n := started[w.class]; n < w.min || n > w.max {
			t.Errorf("%s started %d requests of the 600 the capacity ran, want %d to %d", w.class, n, w.min, w.max)
		}
	}
}
