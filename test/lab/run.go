// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package lab

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/proxy/metrics"
	"github.com/tokenwarden/tokenwarden/proxy/server"
)

// Policy is what the proxy does in one run, and which traffic the world sends.
type Policy struct {
	// Name labels the run.
	Name string
	// Agent turns the runaway agent on; Burst the apps' promotion; HeavyBatch runs the
	// batch tenant at its heavy rate.
	Agent, Burst, HeavyBatch bool
	// Scheduler gives the upstream the backend's capacity (its sequences at once), so
	// admitted requests wait in the proxy's queue in priority and token-fair order
	// instead of first-in-first-out in the backend's.
	Scheduler bool
	// RequestsPerMinute limits every key's requests (0: none).
	RequestsPerMinute int64
	// TokensPerMinute limits a tenant's tokens, by tenant name (absent: none), with a
	// bucket of BucketSeconds of refill (absent: one minute).
	TokensPerMinute map[string]int64
	BucketSeconds   map[string]float64
}

// Record is one request of a run, its times in world time since the run began.
type Record struct {
	Tenant, Kind string
	Sent         time.Duration
	// Started is when its first step began on a replica; -1 when it had not by the
	// run's end.
	Started time.Duration
	// Arrived is when it reached the backend; -1 when it did not.
	Arrived time.Duration
	Status  int
	In, Out int64
}

// Wait is the record's queue wait; an unstarted request has waited until end.
func (r Record) Wait(end time.Duration) time.Duration {
	if r.Started < 0 {
		return end - r.Sent
	}
	return r.Started - r.Sent
}

// Result is one run's records and backend steps.
type Result struct {
	Policy  Policy
	World   *World
	Records []Record
	// Steps are the backend's steps, their times since the run began.
	Steps []RunStep
	// End is when the run stopped watching (after the last arrival and the drain).
	End time.Duration
	// Wall is the run's wall time.
	Wall time.Duration
	// Stall is the longest the lab's process was held up (a 2 ms sleep that took this
	// much longer), in wall time, and Stalled the total of the holdups over 20 ms:
	// a busy machine distorts a scaled run, and Disturbed tells.
	Stall, Stalled time.Duration
	// ProxyQueue samples the proxy's queue length by class (interactive, batch,
	// background) every tenth of a world second.
	ProxyQueue []QueueSample
}

// QueueSample is the proxy's queue by class at a time of the run.
type QueueSample struct {
	At      time.Duration
	Waiting [3]int
}

// Disturbed reports whether the machine held the run up enough to distort its
// figures: a holdup over 250 ms of wall time (two seconds of world time at 8×),
// or holdups adding up to over a tenth of the run.
func (r *Result) Disturbed() bool {
	return r.Stall > 250*time.Millisecond || r.Stalled > r.Wall/10
}

// watch measures how late short sleeps wake until stop is closed.
func watch(stop <-chan struct{}, longest, total *time.Duration, done chan<- struct{}) {
	defer close(done)
	const nap = 2 * time.Millisecond
	for {
		select {
		case <-stop:
			return
		default:
		}
		t0 := time.Now()
		time.Sleep(nap)
		late := time.Since(t0) - nap
		*longest = max(*longest, late)
		if late > 20*time.Millisecond {
			*total += late
		}
	}
}

// RunStep is a backend step in run time.
type RunStep struct {
	Start, End time.Duration
	Sequences  map[string]int
	Generated  map[string]int64
	Context    map[string]int64
}

func keyOf(tenant string) string { return "sk-lab-" + tenant }

func sha(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:])
}

// Document renders the proxy's config for a policy, in front of upstream url.
func (w *World) Document(p Policy, url string) string {
	var b strings.Builder
	capacity := ""
	if p.Scheduler {
		capacity = fmt.Sprintf(", capacity: {max_in_flight_requests: %d, max_in_flight_tokens: %d}", w.Slots(), w.CapacityTokens())
	}
	fmt.Fprintf(&b, "upstreams: [{name: backend, url: %s%s}]\napi_keys:\n", url, capacity)
	for _, t := range w.Tenants {
		fmt.Fprintf(&b, "- {name: %s, key_sha256: %s, priority: %s}\n", t.Name, sha(keyOf(t.Name)), t.Class)
	}
	// The proxy's scheduler runs on its clock, which the lab gives world time; the
	// world's knobs it leaves unset are the proxy's defaults.
	if knobs := w.Scheduler.knobs(); knobs != "" {
		fmt.Fprintf(&b, "scheduling: {%s}\n", knobs)
	}
	b.WriteString("rate_limiting:\n  rules:\n")
	any := false
	if p.RequestsPerMinute > 0 {
		any = true
		fmt.Fprintf(&b, "  - {name: requests, dimension: api_key, amount: requests, windows: [{limit: %d, rolling: {period: minute}}]}\n", p.RequestsPerMinute)
	}
	for _, t := range w.Tenants {
		if tpm := p.TokensPerMinute[t.Name]; tpm > 0 {
			any = true
			burst := ""
			if s := p.BucketSeconds[t.Name]; s > 0 {
				burst = fmt.Sprintf(", burst_seconds: %g", s)
			}
			fmt.Fprintf(&b, "  - {name: tokens-%s, dimension: api_key, subjects: [%s], windows: [{limit: %d, rolling: {period: minute%s}}]}\n",
				t.Name, t.Name, tpm, burst)
		}
	}
	if !any {
		return strings.TrimSuffix(b.String(), "rate_limiting:\n  rules:\n")
	}
	return b.String()
}

// CapacityTokens is the upstream's max_in_flight_tokens in the runs with the
// scheduler: the replicas' KV caches, less capacity_headroom, which leaves room for the
// cache each replica cannot use when the next request does not fit in what is left.
func (w *World) CapacityTokens() int64 {
	return int64(float64(int64(w.Backend.Replicas)*w.Backend.KVTokens) * (1 - w.Scheduler.CapacityHeadroom))
}

// arrival is one request the world sends.
type arrival struct {
	at      time.Duration
	t       Tenant
	in, out int64
}

// Arrivals returns the requests the world sends under a policy, in time order:
// Poisson arrivals at each tenant's rate, the same for the same seed.
func (w *World) arrivals(p Policy) []arrival {
	var all []arrival
	d := w.DurationSeconds
	for i, t := range w.Tenants {
		rng := rand.New(rand.NewPCG(uint64(w.Seed), uint64(i)))
		rate := func(at float64) float64 {
			switch t.Kind {
			case KindAgent:
				if !p.Agent || at < t.StartSeconds {
					return 0
				}
			case KindBatch:
				if p.HeavyBatch && t.HeavyRate > 0 {
					return t.HeavyRate
				}
			case KindChat:
				if p.Burst && at >= w.Burst.StartSeconds && at < w.Burst.StartSeconds+w.Burst.Seconds {
					return t.Rate * w.Burst.Multiplier
				}
			}
			return t.Rate
		}
		// Thinning at the tenant's highest rate keeps the arrivals Poisson through a
		// change of rate.
		peak := t.Rate * max(1, w.Burst.Multiplier)
		peak = max(peak, t.HeavyRate)
		if peak <= 0 {
			continue
		}
		step := 0
		for at := rng.ExpFloat64() / peak; at < d; at += rng.ExpFloat64() / peak {
			r := rate(at)
			if rng.Float64()*peak >= r {
				continue
			}
			in := t.Prompt
			if t.Kind == KindAgent && t.PromptEnd > 0 && t.RunSteps > 1 {
				in = t.Prompt + (t.PromptEnd-t.Prompt)*int64(step%t.RunSteps)/int64(t.RunSteps-1)
				step++
			}
			out := t.Answer
			if w.AnswerSpread > 0 {
				out = max(1, int64(float64(t.Answer)*(1+w.AnswerSpread*(2*rng.Float64()-1))))
				out = min(out, t.MaxTokens)
			}
			all = append(all, arrival{at: seconds(at), t: t, in: in, out: out})
		}
	}
	slices.SortFunc(all, func(a, b arrival) int { return int(a.at - b.at) })
	return all
}

// drain is how long, in world time, a run waits after the last arrival for every chat
// request to start.
const drain = 30 * time.Second

// Run runs the world under a policy through the real proxy, in front of a simulated
// backend, and returns what happened.
func (w *World) Run(ctx context.Context, p Policy) (*Result, error) {
	began := time.Now()
	clock := NewClock(w.TimeScale)
	be := NewSimBackend(w.Backend, clock)
	defer be.Close()
	backend := httptest.NewServer(be)
	defer backend.Close()

	store := budget.NewMemory(clock, 100000)
	m := metrics.New(prometheus.NewRegistry())
	srv := server.New(server.Options{Store: store, Memory: store, Clock: clock,
		Metrics: m, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), AccessLog: io.Discard})
	if _, err := srv.Apply([]byte(w.Document(p, backend.URL)), "lab"); err != nil {
		return nil, fmt.Errorf("the lab's proxy config: %w", err)
	}
	front := httptest.NewServer(srv)
	defer front.Close()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1024, MaxConnsPerHost: 0}}
	defer client.CloseIdleConnections()

	arrivals := w.arrivals(p)
	var longest int64
	for _, a := range arrivals {
		longest = max(longest, a.in)
	}
	text := strings.Repeat("abcd", int(longest))

	start := clock.Now()
	since := func() time.Duration { return clock.Since(start) }
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	var stall, stalled time.Duration
	stopWatch, watched := make(chan struct{}), make(chan struct{})
	go watch(stopWatch, &stall, &stalled, watched)
	var samples []QueueSample
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		tk := time.NewTicker(clock.Wall(100 * time.Millisecond))
		defer tk.Stop()
		for {
			select {
			case <-stopWatch:
				return
			case <-tk.C:
			}
			q := QueueSample{At: clock.Since(start)}
			for i, c := range []string{"interactive", "batch", "background"} {
				q.Waiting[i] = int(gauge(m.QueueLength.WithLabelValues("backend", c)))
			}
			samples = append(samples, q)
		}
	}()
	records := make([]Record, len(arrivals))
	var wg sync.WaitGroup
	var mu sync.Mutex
	var firstErr error
	for i, a := range arrivals {
		if d := clock.Wall(a.at - since()); d > 0 {
			select {
			case <-time.After(d):
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		records[i] = Record{Tenant: a.t.Name, Kind: a.t.Kind, Sent: since(), Started: -1, Arrived: -1, In: a.in, Out: a.out}
		wg.Add(1)
		go func(i int, a arrival) {
			defer wg.Done()
			body := `{"model":"lab","max_tokens":` + strconv.FormatInt(a.t.MaxTokens, 10) +
				`,"messages":[{"role":"user","content":"` + text[:4*a.in] + `"}]}`
			req, _ := http.NewRequestWithContext(runCtx, "POST", front.URL+"/v1/chat/completions", strings.NewReader(body))
			req.Header.Set("Authorization", "Bearer "+keyOf(a.t.Name))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set(headerInput, strconv.FormatInt(a.in, 10))
			req.Header.Set(headerOutput, strconv.FormatInt(a.out, 10))
			req.Header.Set(headerID, strconv.Itoa(i))
			req.Header.Set(headerTenant, a.t.Name)
			resp, err := client.Do(req)
			if err != nil {
				if runCtx.Err() == nil {
					mu.Lock()
					firstErr = cmpErr(firstErr, fmt.Errorf("%s request: %w", a.t.Name, err))
					mu.Unlock()
				}
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
			mu.Lock()
			records[i].Status = resp.StatusCode
			mu.Unlock()
		}(i, a)
	}
	// The run ends once every chat request has started or been refused, or after the
	// drain.
	deadline := w.Duration() + drain
	for since() < deadline {
		pending := false
		mu.Lock()
		for i, r := range records {
			if r.Kind == KindChat && r.Status == 0 {
				if _, ok := be.Started(strconv.Itoa(i)); !ok {
					pending = true
					break
				}
			}
		}
		mu.Unlock()
		if !pending {
			break
		}
		select {
		case <-time.After(10 * time.Millisecond):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	end := max(since(), w.Duration())
	close(stopWatch)
	<-watched
	<-sampled
	cancel()
	wg.Wait()
	if firstErr != nil {
		return nil, firstErr
	}
	res := &Result{Policy: p, World: w, End: end, Records: records, Stall: stall, Stalled: stalled, ProxyQueue: samples}
	for i := range res.Records {
		if t, ok := be.Started(strconv.Itoa(i)); ok {
			res.Records[i].Started = t.Sub(start)
		}
		if t, ok := be.Arrived(strconv.Itoa(i)); ok {
			res.Records[i].Arrived = t.Sub(start)
		}
	}
	for _, st := range be.Steps() {
		res.Steps = append(res.Steps, RunStep{Start: st.Start.Sub(start), End: st.End.Sub(start), Sequences: st.Sequences, Generated: st.Generated, Context: st.Context})
	}
	res.Wall = time.Since(began)
	return res, nil
}

func gauge(g prometheus.Gauge) float64 {
	var m dto.Metric
	if err := g.Write(&m); err != nil {
		return 0
	}
	return m.GetGauge().GetValue()
}

func cmpErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}
