// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

// Package soak runs a fleet of proxies under mixed honest and hostile traffic for a
// while and checks what a platform team relies on: no tenant, hostile or not, is
// served more than its budget; no proxy crashes; goroutines and heap stay flat. It runs
// the fleet on memory storage and on a real redis-server (SOAK_STORES), each for
// SOAK_DURATION: `make soak` ten minutes each, `make test` ten seconds each.
package soak

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
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
	"github.com/tokenwarden/tokenwarden/test/fakellm"
	"github.com/tokenwarden/tokenwarden/test/redisserver"
)

const (
	replicas = 3
	// tpm is every tenant's per-key minute budget for the fleet.
	tpm = 60000
)

// tenant is one API key and the traffic it sends.
type tenant struct {
	name string
	// behaviour is what the fake backend does with this tenant's requests.
	behaviour fakellm.Behaviour
	// send sends one request and returns its status; it reads (or cuts) the answer.
	send func(c *http.Client, base string, t *tenant) int
	// workers is how many requests the tenant keeps in flight.
	workers int
	// biggest is the most one of its requests can be served (input + output).
	biggest int64
	// ok are the statuses this tenant expects; anything else is a failure.
	ok map[int]bool

	codes sync.Map // status → *atomic.Int64
}

func (t *tenant) count(code int) {
	v, _ := t.codes.LoadOrStore(code, new(atomic.Int64))
	v.(*atomic.Int64).Add(1)
}

func chatBody(maxTokens int, extra string) string {
	return fmt.Sprintf(`{"model":"demo","max_tokens":%d,"messages":[{"role":"user","content":"Summarise the catalogue."}]%s}`, maxTokens, extra)
}

// post sends body to base+path as tenant t, with extra header pairs, and hands the
// response to read (which must close nothing); it returns the status.
func post(c *http.Client, base, path, body string, t *tenant, read func(*http.Response), hdr ...string) int {
	req, _ := http.NewRequest("POST", base+path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer sk-"+t.name)
	req.Header.Set("Content-Type", "application/json")
	b, _ := json.Marshal(t.behaviour)
	req.Header.Set(fakellm.HeaderBehaviour, string(b))
	req.Header.Set(fakellm.HeaderTenant, t.name)
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := c.Do(req)
	if err != nil {
		return -1
	}
	defer func() { _ = resp.Body.Close() }()
	if read != nil && resp.StatusCode == 200 {
		read(resp)
	} else {
		_, _ = io.Copy(io.Discard, resp.Body)
	}
	return resp.StatusCode
}

func drain(resp *http.Response) { _, _ = io.Copy(io.Discard, resp.Body) }

// cutAfterDeltas reads a stream until it has seen n content deltas, then hangs up
// before the final usage event.
func cutAfterDeltas(n int) func(*http.Response) {
	return func(resp *http.Response) {
		sc := bufio.NewScanner(resp.Body)
		seen := 0
		for sc.Scan() && seen < n {
			if bytes.Contains(sc.Bytes(), []byte(`"content":"word`)) {
				seen++
			}
		}
	}
}

var anyOK = map[int]bool{200: true, 429: true}

func tenants() []*tenant {
	usage := func(in, out int64) fakellm.Behaviour { return fakellm.Behaviour{InputTokens: in, OutputTokens: out} }
	plain := func(maxTokens int, extra string, hdr ...string) func(*http.Client, string, *tenant) int {
		return func(c *http.Client, base string, t *tenant) int {
			return post(c, base, "/v1/chat/completions", chatBody(maxTokens, extra), t, drain, hdr...)
		}
	}
	return []*tenant{
		{name: "honest-chat", behaviour: usage(400, 300), send: plain(400, ""), workers: 2, biggest: 700, ok: anyOK},
		{name: "honest-stream", behaviour: usage(400, 300), send: plain(400, `,"stream":true,"stream_options":{"include_usage":true}`),
			workers: 2, biggest: 700, ok: anyOK},
		// Reports far more than it reserved: the overage goes into debt.
		{name: "undercount", behaviour: usage(3000, 2000), send: plain(10, ""), workers: 2, biggest: 5000, ok: anyOK},
		// Asks for gzip; the backend compresses; the proxy must still read the usage.
		{name: "gzip", behaviour: func() fakellm.Behaviour { b := usage(400, 300); b.Encoding = "gzip"; return b }(),
			send: plain(400, "", "Accept-Encoding", "gzip"), workers: 2, biggest: 700, ok: anyOK},
		// Reads every delta and hangs up before the usage event.
		{name: "cut-stream", behaviour: usage(400, 300), workers: 2, biggest: 700, ok: anyOK,
			send: func(c *http.Client, base string, t *tenant) int {
				return post(c, base, "/v1/chat/completions", chatBody(400, `,"stream":true,"stream_options":{"include_usage":true}`), t, cutAfterDeltas(299))
			}},
		// A backend that reports no usage.
		{name: "no-usage", behaviour: fakellm.Behaviour{OutputTokens: 300, OmitUsage: true}, send: plain(400, ""), workers: 2, biggest: 700, ok: anyOK},
		// Spellings of the same fields: escapes, duplicates, a ceiling that would overflow.
		{name: "spelling", behaviour: usage(400, 300), workers: 2, biggest: 700, ok: anyOK,
			send: func(c *http.Client, base string, t *tenant) int {
				body := `{"mod\u0065l":"demo","max_tokens":1e30,"max_\u0074okens":400,"n":9e18,"n":1,"m\u0065ssages":[{"role":"user","content":"hi"}]}`
				return post(c, base, "/v1/chat/completions", body, t, drain)
			}},
		// A path the upstream normalises to the charged route.
		{name: "paths", behaviour: usage(400, 300), workers: 2, biggest: 700, ok: anyOK,
			send: func(c *http.Client, base string, t *tenant) int {
				path := []string{"//v1/chat/completions", "/v1//chat/completions", "/v1/chat/./completions", "/v1/chat/completions/"}[rand.IntN(4)]
				return post(c, base, path, chatBody(400, ""), t, drain)
			}},
		// Nested deeper than any upstream reads: 400, nothing served.
		{name: "deep", send: func(c *http.Client, base string, t *tenant) int {
			return post(c, base, "/v1/chat/completions", `{"messages":`+strings.Repeat("[", 64<<10), t, drain)
		}, workers: 1, ok: map[int]bool{400: true}},
		// A streamed usage event on a line over 1 MiB.
		{name: "long-line", behaviour: func() fakellm.Behaviour { b := usage(400, 300); b.PadBytes = 2 << 20; return b }(),
			send: plain(400, `,"stream":true,"stream_options":{"include_usage":true}`), workers: 1, biggest: 700, ok: anyOK},
	}
}

func duration(t *testing.T) time.Duration {
	if s := os.Getenv("SOAK_DURATION"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			t.Fatalf("SOAK_DURATION: %v", err)
		}
		return d
	}
	return 10 * time.Second
}

// fleetDoc is the fleet's config: one per-key minute budget for every tenant, divided
// among the replicas.
func fleetDoc(upstream string, ts []*tenant) string {
	var b strings.Builder
	fmt.Fprintf(&b, "upstreams: [{name: fake, url: %q}]\napi_keys:\n", upstream)
	for _, t := range ts {
		fmt.Fprintf(&b, "- {name: %s, key_sha256: %q}\n", t.name, keyHash("sk-"+t.name))
	}
	fmt.Fprintf(&b, "rate_limiting:\n  budget_division: {replicas: %d}\n  limits:\n    per_api_key: {tokens_per_minute: %d}\n", replicas, tpm)
	return b.String()
}

// panics counts what net/http logged about a handler that panicked.
type panics struct{ n atomic.Int64 }

func (p *panics) Write(b []byte) (int, error) {
	if bytes.Contains(b, []byte("panic")) {
		p.n.Add(1)
		_, _ = os.Stderr.Write(b)
	}
	return len(b), nil
}

func sample() (goroutines int, heap uint64) {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return runtime.NumGoroutine(), m.HeapAlloc
}

// stores are the storages the soak runs the fleet on, each for the whole duration:
// SOAK_STORES, default both.
func stores() []string {
	if s := os.Getenv("SOAK_STORES"); s != "" {
		return strings.Split(s, ",")
	}
	return []string{"memory", "redis"}
}

func TestSoak(t *testing.T) {
	for _, storage := range stores() {
		t.Run(storage, func(t *testing.T) { soak(t, storage) })
	}
}

// fleet is the proxies under soak and how to read what a tenant still owes.
type fleet struct {
	fronts []*httptest.Server
	// owed is the debt a tenant's key bucket still holds, over every bucket that
	// enforces it (one per replica in memory, the shared one in Redis).
	owed func(tenant string) float64
}

// newFleet starts the replicas on memory (each its share of the budget) or on one
// real redis-server (the buckets shared). crashes receives net/http's error log.
func newFleet(t *testing.T, storage, upstream string, ts []*tenant, crashes io.Writer) *fleet {
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	f := &fleet{}
	var levels []func(budget.Key) (float64, bool)
	doc := fleetDoc(upstream, ts)
	var redisURL string
	if storage == "redis" {
		redisURL = redisserver.Start(t).URL()
		doc += fmt.Sprintf("  storage: redis\n  redis: {url: %q, key_prefix: soak}\n", redisURL)
	}
	for i := range replicas {
		mem := budget.NewMemory(budget.SystemClock{}, 100000)
		var store budget.Store = mem
		levels = append(levels, mem.Level)
		if storage == "redis" {
			rs, err := redisstore.New(redisstore.Options{URL: redisURL, Prefix: "soak", Fallback: mem, Logger: logger})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = rs.Close() })
			store = rs
			if i == 0 {
				levels = []func(budget.Key) (float64, bool){func(k budget.Key) (float64, bool) {
					l, ok, err := rs.Level(context.Background(), k)
					return l, ok && err == nil
				}}
			}
		}
		srv := server.New(server.Options{Store: store, Memory: mem, Metrics: metrics.New(prometheus.NewRegistry()), Logger: logger,
			AsyncSettle: storage == "redis", AccessLog: io.Discard})
		if _, err := srv.Apply([]byte(doc), "soak"); err != nil {
			t.Fatal(err)
		}
		front := httptest.NewUnstartedServer(srv)
		front.Config.ErrorLog = log.New(crashes, "", 0)
		front.Start()
		t.Cleanup(front.Close)
		f.fronts = append(f.fronts, front)
	}
	f.owed = func(tenant string) float64 {
		var owed float64
		for _, level := range levels {
			if l, ok := level(budget.Key{Kind: budget.TokensMinute, Dim: budget.APIKey, ID: tenant}); ok && l < 0 {
				owed += -l
			}
		}
		return owed
	}
	return f
}

func soak(t *testing.T, storage string) {
	d := duration(t)
	llm := fakellm.New()
	llm.StopRecording()
	backend := httptest.NewServer(llm)
	defer backend.Close()

	ts := tenants()
	crashes := &panics{}
	fl := newFleet(t, storage, backend.URL, ts, crashes)
	fronts := fl.fronts

	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = 64
	tr.DisableCompression = true // the gzip tenant asks for gzip itself and reads raw bytes
	client := &http.Client{Transport: tr, Timeout: 30 * time.Second}

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	run := func(t *tenant) {
		defer wg.Done()
		for ctx.Err() == nil {
			base := fronts[rand.IntN(replicas)].URL
			code := t.send(client, base, t)
			t.count(code)
			if code != 200 {
				// A refused client backs off a little, as an SDK would (not the whole
				// Retry-After: the soak wants to keep knocking).
				time.Sleep(time.Duration(20+rand.IntN(80)) * time.Millisecond)
			}
		}
	}
	start := time.Now()
	for _, tn := range ts {
		for range tn.workers {
			wg.Add(1)
			go run(tn)
		}
	}

	// Warm up for a tenth of the run, then sample goroutines and heap as the run goes.
	warm := d / 10
	time.Sleep(warm)
	g0, h0 := sample()
	type point struct {
		at         time.Duration
		goroutines int
		heap       uint64
	}
	points := []point{{warm, g0, h0}}
	for step := 1; step <= 9; step++ {
		time.Sleep(d / 10)
		g, h := sample()
		points = append(points, point{time.Since(start).Round(time.Second), g, h})
	}
	cancel()
	wg.Wait()
	elapsed := time.Since(start)
	tr.CloseIdleConnections()

	// What each tenant was served against what its budget allows over the run: the
	// fleet's capacity plus the refill, 1% of slack for timing, one request of slack for
	// the one admitted last, and the debt still owed (an overage the tenant repays by
	// waiting after the run).
	served := llm.Served()
	for _, tn := range ts {
		owed := fl.owed(tn.name)
		allowed := float64(tpm)*(1+elapsed.Minutes())*1.01 + float64(tn.biggest) + owed
		codes := map[int]int64{}
		tn.codes.Range(func(k, v any) bool { codes[k.(int)] = v.(*atomic.Int64).Load(); return true })
		t.Logf("%-14s served %8d tokens of %8.0f allowed (debt owed %6.0f); answers %v", tn.name, served[tn.name], allowed, owed, codes)
		if float64(served[tn.name]) > allowed {
			t.Errorf("%s was served %d tokens, more than its budget allows over %v (%.0f)", tn.name, served[tn.name], elapsed.Round(time.Second), allowed)
		}
		for code := range codes {
			if !tn.ok[code] {
				t.Errorf("%s got %d answers %d", tn.name, codes[code], code)
			}
		}
		if tn.name == "honest-chat" && served[tn.name] == 0 {
			t.Errorf("the honest tenant was never served")
		}
	}
	if n := crashes.n.Load(); n > 0 {
		t.Errorf("%d handler panics", n)
	}

	// Flat: after the run, with idle connections closed, no more goroutines than at the
	// end of the warm-up, and the heap within half again of it (plus 16 MiB for the
	// copy buffers and connection pools that come and go).
	gEnd, hEnd := sample()
	for i := 0; i < 50 && gEnd > g0; i++ { // connections finish closing
		time.Sleep(100 * time.Millisecond)
		gEnd, hEnd = sample()
	}
	for _, p := range points {
		t.Logf("at %-5v goroutines %4d heap %6.1f MiB", p.at, p.goroutines, float64(p.heap)/(1<<20))
	}
	t.Logf("after  goroutines %4d heap %6.1f MiB", gEnd, float64(hEnd)/(1<<20))
	if gEnd > g0 {
		t.Errorf("goroutines grew from %d after the warm-up to %d after the run", g0, gEnd)
	}
	if float64(hEnd) > float64(h0)*1.5+16<<20 {
		t.Errorf("the heap grew from %.1f MiB after the warm-up to %.1f MiB after the run", float64(h0)/(1<<20), float64(hEnd)/(1<<20))
	}
}

func keyHash(k string) string {
	s := sha256.Sum256([]byte(k))
	return hex.EncodeToString(s[:])
}
