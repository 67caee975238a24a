// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package lab

import (
	"encoding/json"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/tokenwarden/tokenwarden/test/fakellm"
)

// Headers the lab's clients send to the simulated backend: what the request really
// uses (the proxy sees only the prompt text and max_tokens), whose it is, and its id.
const (
	headerInput  = "X-Lab-Input"
	headerOutput = "X-Lab-Output"
	headerID     = "X-Lab-Id"
	headerTenant = "X-Lab-Tenant"
)

// Clock is world time: wall time since a start, multiplied by the world's scale.
type Clock struct {
	start time.Time
	scale float64
}

// NewClock starts a world clock at the wall clock's now.
func NewClock(scale float64) *Clock { return &Clock{start: time.Now(), scale: scale} }

// Now returns world time.
func (c *Clock) Now() time.Time { return c.start.Add(c.Since(c.start)) }

// Since returns the world time since t0, a world instant.
func (c *Clock) Since(t0 time.Time) time.Duration {
	world := c.start.Add(time.Duration(float64(time.Since(c.start)) * c.scale))
	return world.Sub(t0)
}

// Wall converts a world duration to wall time.
func (c *Clock) Wall(d time.Duration) time.Duration { return time.Duration(float64(d) / c.scale) }

// After starts a timer that fires after d of world time, and returns its channel and
// its Stop: the proxy's scheduler times its waits' deadlines with it.
func (c *Clock) After(d time.Duration) (<-chan time.Time, func() bool) {
	t := time.NewTimer(c.Wall(d))
	return t.C, t.Stop
}

// job is one request on the simulated backend.
type job struct {
	id, tenant string
	in, out    int64
	arrival    time.Time
	start      time.Time
	generated  int64
	prefilled  bool
	done       chan struct{}
}

type replica struct {
	running []*job
	// kv is the context tokens (prompt and answer) its running sequences hold.
	kv        int64
	busy      bool
	stepStart time.Time
	stepEnd   time.Time
	idleSince time.Time
}

// Step is one replica step, for the chart: per tenant, the sequences it ran and the
// output tokens it generated.
type Step struct {
	Start, End time.Time
	Sequences  map[string]int
	Generated  map[string]int64
	// Context is the KV cache the tenant's sequences held in the step.
	Context map[string]int64
}

// SimBackend is a backend of replicas with continuous batching and a linear step
// time, simulated in world time by one event loop that follows the world clock. It is
// an http.Handler answering as the fake LLM does, with the usage the request's lab
// headers give, once the request's last token is generated.
type SimBackend struct {
	b     Backend
	clock *Clock
	llm   *fakellm.Server

	mu       sync.Mutex
	queue    []*job
	replicas []replica
	now      time.Time // the simulation's time
	starts   map[string]time.Time
	arrived  map[string]time.Time
	steps    []Step
	wake     chan struct{}
	stop     chan struct{}
	stopped  chan struct{}
}

// NewSimBackend starts the backend's event loop; Close stops it.
func NewSimBackend(b Backend, clock *Clock) *SimBackend {
	llm := fakellm.New()
	llm.StopRecording()
	s := &SimBackend{b: b, clock: clock, llm: llm, replicas: make([]replica, b.Replicas),
		now: clock.Now(), starts: map[string]time.Time{}, arrived: map[string]time.Time{}, wake: make(chan struct{}, 1),
		stop: make(chan struct{}), stopped: make(chan struct{})}
	for i := range s.replicas {
		s.replicas[i].idleSince = s.now
	}
	go s.loop()
	return s
}

// Close stops the event loop; requests still running are answered 503.
func (s *SimBackend) Close() {
	close(s.stop)
	<-s.stopped
}

// Started returns when the request with this id started on a replica.
func (s *SimBackend) Started(id string) (time.Time, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t, ok := s.starts[id]
	return t, ok
}

// Arrived returns when the request with this id reached the backend.
func (s *SimBackend) Arrived(id string) (time.Time, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t, ok := s.arrived[id]
	return t, ok
}

// Steps returns the steps run so far.
func (s *SimBackend) Steps() []Step {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Step(nil), s.steps...)
}

// Waiting returns the requests in the backend's own queue.
func (s *SimBackend) Waiting() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.queue)
}

// ServeHTTP queues the request, waits for its last token, and answers.
func (s *SimBackend) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	in, _ := strconv.ParseInt(r.Header.Get(headerInput), 10, 64)
	out, _ := strconv.ParseInt(r.Header.Get(headerOutput), 10, 64)
	j := &job{id: r.Header.Get(headerID), tenant: r.Header.Get(headerTenant), in: max(in, 1), out: max(out, 1),
		done: make(chan struct{})}
	s.mu.Lock()
	j.arrival = s.clock.Now()
	s.arrived[j.id] = j.arrival
	s.queue = append(s.queue, j)
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
	select {
	case <-j.done:
	case <-r.Context().Done():
		s.drop(j)
		return
	case <-s.stop:
		http.Error(w, "the lab's backend stopped", http.StatusServiceUnavailable)
		return
	}
	b, _ := json.Marshal(fakellm.Behaviour{InputTokens: j.in, OutputTokens: j.out})
	r.Header.Set(fakellm.HeaderBehaviour, string(b))
	s.llm.ServeHTTP(w, r)
}

// drop removes a request whose client went away.
func (s *SimBackend) drop(j *job) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, q := range s.queue {
		if q == j {
			s.queue = append(s.queue[:i], s.queue[i+1:]...)
			return
		}
	}
	for i := range s.replicas {
		rp := &s.replicas[i]
		for k, q := range rp.running {
			if q == j {
				rp.running = append(rp.running[:k], rp.running[k+1:]...)
				rp.kv -= j.in + j.out
				return
			}
		}
	}
}

// tick is how often, in wall time, the loop catches the simulation up with the world
// clock; answers are late by at most this.
const tick = time.Millisecond

func (s *SimBackend) loop() {
	defer close(s.stopped)
	t := time.NewTicker(tick)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
		case <-s.wake:
		}
		s.mu.Lock()
		s.advance(s.clock.Now())
		s.mu.Unlock()
	}
}

// advance runs the simulation's events up to until, in time order: a busy replica's
// step ends, or an idle replica takes a queued request that has arrived.
func (s *SimBackend) advance(until time.Time) {
	for {
		best, at := -1, time.Time{}
		for i := range s.replicas {
			rp := &s.replicas[i]
			var ev time.Time
			switch {
			case rp.busy:
				ev = rp.stepEnd
			case len(s.queue) > 0:
				ev = later(rp.idleSince, s.queue[0].arrival)
			default:
				continue
			}
			if best < 0 || ev.Before(at) {
				best, at = i, ev
			}
		}
		if best < 0 || at.After(until) {
			s.now = until
			return
		}
		s.now = at
		rp := &s.replicas[best]
		if rp.busy {
			s.finishStep(rp)
		}
		// Admit the requests that have arrived, in order, while the replica has room.
		for len(rp.running) < s.b.MaxBatch && len(s.queue) > 0 && !s.queue[0].arrival.After(at) && s.fits(rp, s.queue[0]) {
			j := s.queue[0]
			rp.kv += j.in + j.out
			s.queue = s.queue[1:]
			j.start = at
			s.starts[j.id] = at
			rp.running = append(rp.running, j)
		}
		if len(rp.running) == 0 {
			rp.busy, rp.idleSince = false, at
			continue
		}
		var tokens int64
		for _, j := range rp.running {
			if j.prefilled {
				tokens++
			} else {
				tokens += j.in
			}
		}
		d := time.Duration((s.b.StepBaseMillis + s.b.StepPerTokenMillis*float64(tokens)) * float64(time.Millisecond))
		rp.busy, rp.stepStart, rp.stepEnd = true, at, at.Add(d)
	}
}

// finishStep ends a replica's step: every sequence gains a token (a prompt's step
// yields the first), and those with their whole answer are answered.
func (s *SimBackend) finishStep(rp *replica) {
	st := Step{Start: rp.stepStart, End: rp.stepEnd, Sequences: map[string]int{}, Generated: map[string]int64{}, Context: map[string]int64{}}
	kept := rp.running[:0]
	for _, j := range rp.running {
		j.prefilled = true
		j.generated++
		st.Sequences[j.tenant]++
		st.Context[j.tenant] += j.in + j.out
		st.Generated[j.tenant]++
		if j.generated >= j.out {
			rp.kv -= j.in + j.out
			close(j.done)
			continue
		}
		kept = append(kept, j)
	}
	clear(rp.running[len(kept):])
	rp.running = kept
	rp.busy = false
	rp.idleSince = rp.stepEnd
	s.steps = append(s.steps, st)
}

// fits reports whether the replica's KV cache holds the job's context as well; a job
// larger than the whole cache runs alone.
func (s *SimBackend) fits(rp *replica, j *job) bool {
	return s.b.KVTokens <= 0 || rp.kv == 0 || rp.kv+j.in+j.out <= s.b.KVTokens
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
