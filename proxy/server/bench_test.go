// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package server_test

import (
	"compress/gzip"
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tokenwarden/tokenwarden/proxy/attribute"
	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/proxy/budget/redisstore"
	"github.com/tokenwarden/tokenwarden/proxy/config"
	"github.com/tokenwarden/tokenwarden/proxy/estimate"
	"github.com/tokenwarden/tokenwarden/proxy/metrics"
	"github.com/tokenwarden/tokenwarden/proxy/server"
	"github.com/tokenwarden/tokenwarden/test/redisserver"
)

// benchBackend answers every request with a fixed chat completion and its usage.
func benchBackend() *httptest.Server {
	body := []byte(`{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hello"}}],"usage":{"prompt_tokens":20,"completion_tokens":5}}`)
	return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(body)
	}))
}

const benchRequest = `{"model":"gpt-4o","max_tokens":256,"messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"Summarise the plot of a long novel in three sentences, please."}]}`

// benchDoc configures all six dimensions on both periods, with request-count limits,
// so admission touches the most buckets a request can.
const benchDoc = `
upstreams: [{name: default, url: UPSTREAM}]
api_keys:
- {name: alice, key_sha256: HASH, user: alice, team: research}
rate_limiting:
  budget_division: {replicas: 1}
  max_buckets: 1000000
  limits:
    global:      {requests_per_second: 1000000000, tokens_per_minute: 1000000000000, tokens_per_day: 1000000000000}
    per_client:  {requests_per_second: 1000000000, tokens_per_minute: 1000000000000, tokens_per_day: 1000000000000}
    per_api_key: {requests_per_second: 1000000000, tokens_per_minute: 1000000000000, tokens_per_day: 1000000000000}
    per_user:    {tokens_per_minute: 1000000000000, tokens_per_day: 1000000000000}
    per_team:    {tokens_per_minute: 1000000000000, tokens_per_day: 1000000000000}
    per_model:
      gpt-4o:    {tokens_per_minute: 1000000000000, tokens_per_day: 1000000000000}
`

// benchHTTP drives target with perCore concurrent clients per core (32 gives 64
// connections on this 2-core machine), with extra header pairs, and reports the 99th
// percentile latency and the process's CPU time a request beside ns/op.
func benchHTTP(b *testing.B, target string, perCore int, header ...string) {
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 128, MaxIdleConns: 128}}
	var mu sync.Mutex
	var lat []time.Duration
	defer client.CloseIdleConnections()
	b.SetParallelism(perCore)
	b.ReportAllocs()
	b.ResetTimer()
	cost := startCost(b)
	b.RunParallel(func(pb *testing.PB) {
		local := make([]time.Duration, 0, 1024)
		for pb.Next() {
			start := time.Now()
			req, _ := http.NewRequest("POST", target+"/v1/chat/completions", strings.NewReader(benchRequest))
			req.Header.Set("Authorization", "Bearer sk-alice")
			req.Header.Set("Content-Type", "application/json")
			for i := 0; i+1 < len(header); i += 2 {
				req.Header.Set(header[i], header[i+1])
			}
			resp, err := client.Do(req)
			if err != nil {
				b.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 {
				b.Fatalf("status %d", resp.StatusCode)
			}
			local = append(local, time.Since(start))
		}
		mu.Lock()
		lat = append(lat, local...)
		mu.Unlock()
	})
	b.StopTimer()
	cost.report()
	if len(lat) > 0 {
		slices.Sort(lat)
		b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
	}
}

// BenchmarkProxy compares, in one run over loopback HTTP at 64 connections: the
// backend reached directly, through a bare httputil.ReverseProxy, and through the
// tokenwarden proxy enforcing every dimension on both periods.
func BenchmarkProxy(b *testing.B) {
	backend := benchBackend()
	defer backend.Close()
	target, _ := url.Parse(backend.URL)

	b.Run("direct", func(b *testing.B) {
		benchHTTP(b, backend.URL, 32)
	})
	b.Run("bare-reverseproxy", func(b *testing.B) {
		defer closeRow(backend)
		front := bareReverseProxy(target)
		defer front.Close()
		benchHTTP(b, front.URL, 32)
	})
	b.Run("tokenwarden-memory", func(b *testing.B) {
		defer closeRow(backend)
		srv := newBenchServer(b, backend.URL)
		front := httptest.NewServer(srv)
		defer front.Close()
		benchHTTP(b, front.URL, 32)
	})
	b.Run("tokenwarden-memory-rules", func(b *testing.B) {
		defer closeRow(backend)
		srv := newBenchServerDoc(b, backend.URL, rulesDoc)
		front := httptest.NewServer(srv)
		defer front.Close()
		benchHTTP(b, front.URL, 32)
	})
	b.Run("tokenwarden-memory-scheduled", func(b *testing.B) {
		defer closeRow(backend)
		// A capacity it never reaches and every limit for agents: what the scheduler
		// costs below capacity.
		front := httptest.NewServer(newBenchServerDoc(b, backend.URL, agentsBenchDoc))
		defer front.Close()
		benchHTTP(b, front.URL, 32, "X-Tokenwarden-Run-Id", "run-1")
	})
	b.Run("tokenwarden-memory-registry", func(b *testing.B) {
		defer closeRow(backend)
		// The model registry with two upstreams for the model: the lookup and the
		// health checks.
		front := httptest.NewServer(newBenchServerDoc(b, backend.URL, registryDocBench))
		defer front.Close()
		benchHTTP(b, front.URL, 32)
	})
	b.Run("tokenwarden-redis", func(b *testing.B) {
		defer closeRow(backend)
		srv := newRedisBenchServer(b, backend.URL, benchDoc)
		front := httptest.NewServer(srv)
		defer front.Close()
		benchHTTP(b, front.URL, 32)
	})
	b.Run("tokenwarden-redis-typical", func(b *testing.B) {
		defer closeRow(backend)
		srv := newRedisBenchServer(b, backend.URL, typicalDoc)
		front := httptest.NewServer(srv)
		defer front.Close()
		benchHTTP(b, front.URL, 32)
	})
}

// rulesDoc is the limits document of benchDoc with ten limit rules of the
// kinds a memory fleet may hold (rolling windows of tokens, input and output tokens and
// requests, named subjects, a fan-out by model, bursts) besides the limits of
// the api_key dimension: seventeen counters per request.
const rulesDoc = benchDoc + `
  rules:
  - {name: fleet, dimension: global, windows: [{limit: 1000000000000, rolling: {period: minute}}]}
  - {name: research, dimension: team, subjects: [research], windows: [{limit: 1000000000000, rolling: {period: minute, burst_seconds: 20}}]}
  - {name: key-input, dimension: api_key, amount: input_tokens, windows: [{limit: 1000000000000, rolling: {period: minute}}]}
  - {name: key-output, dimension: api_key, amount: output_tokens, windows: [{limit: 1000000000000, rolling: {period: minute}}]}
  - {name: key-model-rpm, dimension: api_key, count_by: model, amount: requests, windows: [{limit: 1000000000000, rolling: {period: minute}}]}
  - {name: user-hour, dimension: user, windows: [{limit: 1000000000000, rolling: {period: hour, burst_seconds: 600}}]}
  - {name: gpt-4o-day, dimension: model, subjects: [gpt-4o], windows: [{limit: 1000000000000, rolling: {period: day}}]}
  - {name: client-rps, dimension: client, amount: requests, windows: [{limit: 1000000000000, rolling: {period: second}}]}
  - {name: team-day, dimension: team, windows: [{limit: 1000000000000, rolling: {period: day}}]}
  - {name: watch, dimension: api_key, action: warn, windows: [{limit: 1000000000000, rolling: {period: minute}}]}
`

// typicalDoc is a common fleet: a global minute budget, each key's minute and day
// budgets and a team minute budget: four token buckets per request.
const typicalDoc = `
upstreams: [{name: default, url: UPSTREAM}]
api_keys:
- {name: alice, key_sha256: HASH, user: alice, team: research}
rate_limiting:
  budget_division: {replicas: 1}
  limits:
    global:      {tokens_per_minute: 1000000000000}
    per_api_key: {tokens_per_minute: 1000000000000, tokens_per_day: 1000000000000}
    per_team:    {tokens_per_minute: 1000000000000}
`

// newRedisBenchServer is the benchmark proxy on a real redis-server started for it.
func newRedisBenchServer(b *testing.B, upstream, benchDoc string) *server.Server {
	rs := redisserver.Start(b)
	benchRedis.Store(b, rs)
	b.Cleanup(func() { benchRedis.Delete(b) })
	mem := budget.NewMemory(budget.SystemClock{}, 1000000)
	store, err := redisstore.New(redisstore.Options{URL: rs.URL(), DialTimeout: 100 * time.Millisecond,
		ReadTimeout: 100 * time.Millisecond, WriteTimeout: 100 * time.Millisecond, Fallback: mem})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = store.Close() })
	m := metrics.New(prometheus.NewRegistry())
	srv := server.New(server.Options{Store: store, Memory: mem, Metrics: m, AsyncSettle: true,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), AccessLog: io.Discard})
	doc := strings.ReplaceAll(strings.ReplaceAll(benchDoc, "UPSTREAM", upstream), "HASH", keyHash("sk-alice"))
	doc = strings.Replace(doc, "rate_limiting:\n", "rate_limiting:\n  storage: redis\n  redis: {url: \""+rs.URL()+"\"}\n", 1)
	if _, err := srv.Apply([]byte(doc), "bench"); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if n := testutil.CollectAndCount(m.RedisUnavailableVec); n > 0 {
			b.Errorf("%d dimensions found Redis unavailable during the benchmark", n)
		}
	})
	return srv
}

// BenchmarkLatency measures one connection at a time, where latency is the proxy's own
// and not queueing: the backend directly, through a bare reverse proxy, and through
// tokenwarden.
func BenchmarkLatency(b *testing.B) {
	backend := benchBackend()
	defer backend.Close()
	target, _ := url.Parse(backend.URL)
	bare := httptest.NewServer(httputil.NewSingleHostReverseProxy(target))
	defer bare.Close()
	tw := httptest.NewServer(newBenchServer(b, backend.URL))
	defer tw.Close()
	twRedis := httptest.NewServer(newRedisBenchServer(b, backend.URL, benchDoc))
	defer twRedis.Close()
	for _, c := range []struct{ name, url string }{{"direct", backend.URL}, {"bare-reverseproxy", bare.URL},
		{"tokenwarden-memory", tw.URL}, {"tokenwarden-redis", twRedis.URL}} {
		b.Run(c.name, func(b *testing.B) {
			old := runtime.GOMAXPROCS(1)
			defer runtime.GOMAXPROCS(old)
			benchHTTP(b, c.url, 1)
		})
	}
}

func newBenchServer(b *testing.B, upstream string) *server.Server {
	return newBenchServerDoc(b, upstream, benchDoc)
}

// newBenchServerDoc is the benchmark proxy on the memory store with a document of its own.
func newBenchServerDoc(b *testing.B, upstream, benchDoc string) *server.Server {
	store := budget.NewMemory(budget.SystemClock{}, 1000000)
	srv := server.New(server.Options{Store: store, Metrics: metrics.New(prometheus.NewRegistry()),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), AccessLog: io.Discard})
	doc := strings.ReplaceAll(strings.ReplaceAll(benchDoc, "UPSTREAM", upstream), "HASH", keyHash("sk-alice"))
	if _, err := srv.Apply([]byte(doc), "bench"); err != nil {
		b.Fatal(err)
	}
	return srv
}

// chatBody4K is a 4 KB chat request: a system prompt, six turns and a tool.
var chatBody4K = func() []byte {
	var sb strings.Builder
	sb.WriteString(`{"model":"gpt-4o","max_completion_tokens":1024,"temperature":0.2,"tools":[{"type":"function","function":{"name":"search","description":"Search the catalogue","parameters":{"type":"object","properties":{"q":{"type":"string"}}}}}],"messages":[`)
	sb.WriteString(`{"role":"system","content":"You are a careful assistant for a book store. Answer briefly and cite the catalogue."}`)
	turn := strings.Repeat("The customer asks about novels set in Lisbon between the wars, in translation, under twenty euros. ", 5)
	for i := 0; sb.Len() < 4000; i++ {
		role := "user"
		if i%2 == 1 {
			role = "assistant"
		}
		sb.WriteString(`,{"role":"` + role + `","content":"` + turn + `"}`)
	}
	sb.WriteString(`]}`)
	return []byte(sb.String())
}()

// BenchmarkAdmission is the proxy's own admission work on one 4 KB chat request:
// estimate the body in one pass, reserve on six dimensions times two periods plus three
// request-count buckets, and settle on the reported usage; no network.
func BenchmarkAdmission(b *testing.B) {
	big := config.DimensionLimits{RequestsPerSecond: 1 << 40, TokensPerMinute: 1 << 50, TokensPerDay: 1 << 50}
	tok := config.DimensionLimits{TokensPerMinute: 1 << 50, TokensPerDay: 1 << 50}
	cfg := &config.Config{
		APIKeys: []config.APIKey{{Name: "alice", User: "alice", Team: "research"}},
		RateLimiting: config.RateLimiting{Limits: config.Limits{
			Global: big, PerClient: big, PerAPIKey: big, PerUser: tok, PerTeam: tok,
			PerModel: map[string]config.DimensionLimits{"gpt-4o": tok},
		}},
	}
	p := budget.NewPolicy(cfg)
	l := budget.NewLimiter(budget.NewMemory(budget.SystemClock{}, 1<<20), metrics.New(prometheus.NewRegistry()), budget.SystemClock{}, false)
	ctx := context.Background()
	b.SetBytes(int64(len(chatBody4K)))
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		e, _ := estimate.Body(chatBody4K)
		d, err := l.Admit(ctx, p, budget.Identity{Key: p.Key("alice"), Client: "10.0.0.1", Model: e.Model}, budget.Ask{Input: e.Input, Output: e.Output})
		if err != nil || d.Refusal != nil || d.Hold == nil {
			b.Fatal("not admitted")
		}
		d.Hold.Settle(budget.Used{Input: e.Input, Output: 200})
	}
}

// BenchmarkAdmissionRules compares, in one run (-count interleaves them), the
// admission work of BenchmarkAdmission on the limits shape (15 buckets) and on
// ten rules that all apply to the request: tokens, input, output, requests and cost
// amounts, named and each-subject, count_by, rolling windows with bursts and a
// calendar month in Berlin; and on a platform budget, a tenant budget and a session
// budget (the session read from its header and bounded among the key's values).
func BenchmarkAdmissionRules(b *testing.B) {
	big := config.DimensionLimits{RequestsPerSecond: 1 << 40, TokensPerMinute: 1 << 50, TokensPerDay: 1 << 50}
	tok := config.DimensionLimits{TokensPerMinute: 1 << 50, TokensPerDay: 1 << 50}
	keys := []config.APIKey{{Name: "alice", User: "alice", Team: "research"}}
	limits := &config.Config{APIKeys: keys, RateLimiting: config.RateLimiting{Limits: config.Limits{
		Global: big, PerClient: big, PerAPIKey: big, PerUser: tok, PerTeam: tok,
		PerModel: map[string]config.DimensionLimits{"gpt-4o": tok},
	}}}
	rolling := func(limit float64, period config.Period, burst float64) []config.Window {
		return []config.Window{{Limit: limit, Rolling: &config.Rolling{Period: period, BurstSeconds: burst}}}
	}
	const huge = 1 << 50
	rules := &config.Config{
		APIKeys: keys,
		Models:  []config.Model{{Name: "gpt-4o", Price: &config.Price{Input: 2.5, Output: 10}}},
		RateLimiting: config.RateLimiting{Rules: []config.Rule{
			{Name: "fleet", Dimension: config.RuleGlobal, Amount: config.AmountTokens, Windows: rolling(huge, config.PeriodMinute, 0)},
			{Name: "research", Dimension: config.RuleTeam, Subjects: []string{"research"}, Amount: config.AmountTokens, Windows: rolling(huge, config.PeriodMinute, 20)},
			{Name: "key-input", Dimension: config.RuleAPIKey, Amount: config.AmountInputTokens, Windows: rolling(huge, config.PeriodMinute, 0)},
			{Name: "key-output", Dimension: config.RuleAPIKey, Amount: config.AmountOutputTokens, Windows: rolling(huge, config.PeriodMinute, 0)},
			{Name: "key-model-rpm", Dimension: config.RuleAPIKey, CountBy: config.RuleModel, Amount: config.AmountRequests, Windows: rolling(huge, config.PeriodMinute, 0)},
			{Name: "user-hour", Dimension: config.RuleUser, Amount: config.AmountTokens, Windows: rolling(huge, config.PeriodHour, 600)},
			{Name: "gpt-4o-day", Dimension: config.RuleModel, Subjects: []string{"gpt-4o"}, Amount: config.AmountTokens, Windows: rolling(huge, config.PeriodDay, 0)},
			{Name: "client-rps", Dimension: config.RuleClient, Amount: config.AmountRequests, Windows: rolling(huge, config.PeriodSecond, 0)},
			{Name: "team-dollars", Dimension: config.RuleTeam, Amount: config.AmountCost, Windows: rolling(huge, config.PeriodDay, 0)},
			{Name: "key-month", Dimension: config.RuleAPIKey, Amount: config.AmountTokens,
				Windows: []config.Window{{Limit: huge, Calendar: &config.Calendar{Every: config.EveryMonth, TimeZone: "Europe/Berlin"}}}},
		}},
	}
	// A platform budget, a budget of the key's tenant and a budget per session of
	// the key, the session read from its header.
	sessions := &config.Config{
		APIKeys: []config.APIKey{{Name: "alice", User: "alice", Team: "research", Tenant: "team-a"}},
		RateLimiting: config.RateLimiting{Rules: []config.Rule{
			{Name: "platform", Dimension: config.RuleGlobal, Amount: config.AmountTokens, Windows: rolling(huge, config.PeriodMinute, 0)},
			{Name: "team-a/cap", Tenant: "team-a", Dimension: config.RuleGlobal, Amount: config.AmountTokens, Windows: rolling(huge, config.PeriodMinute, 0)},
			{Name: "team-a/each-session", Tenant: "team-a", Dimension: config.RuleAPIKey, CountBy: config.RuleSession, Amount: config.AmountTokens,
				Windows: rolling(huge, config.PeriodMinute, 0)},
		}},
	}
	hdr := http.Header{}
	hdr.Set(attribute.SessionHeader, "3f2b8c1e-0d4a-4b5e-9a6f-2c7d8e9f0a1b")
	for _, c := range []struct {
		name string
		cfg  *config.Config
	}{{"limits-15-buckets", limits}, {"rules-10", rules}, {"platform-tenant-session", sessions}} {
		b.Run(c.name, func(b *testing.B) {
			p := budget.NewPolicy(c.cfg)
			l := budget.NewLimiter(budget.NewMemory(budget.SystemClock{}, 1<<20), metrics.New(prometheus.NewRegistry()), budget.SystemClock{}, false)
			ctx := context.Background()
			b.SetBytes(int64(len(chatBody4K)))
			b.ReportAllocs()
			for b.Loop() {
				e, _ := estimate.Body(chatBody4K)
				id := budget.Identity{Key: p.Key("alice"), Client: "10.0.0.1", Model: e.Model}
				if p.Reads().Has(budget.AttrSession) {
					id.Session, _ = attribute.Read(hdr, attribute.Session)
				}
				d, err := l.Admit(ctx, p, id, budget.Ask{Input: e.Input, Output: e.Output})
				if err != nil || d.Refusal != nil || d.Hold == nil {
					b.Fatal("not admitted")
				}
				d.Hold.Settle(budget.Used{Input: e.Input, Output: 200})
			}
		})
	}
}

// BenchmarkHandler is one whole request through the proxy's handler (authentication,
// body read, estimation, admission, forwarding to a loopback backend, settlement),
// without the client-side HTTP hop.
func BenchmarkHandler(b *testing.B) {
	backend := benchBackend()
	defer backend.Close()
	benchHandler(b, backend.URL)
}

// BenchmarkHandlerRules is BenchmarkHandler with the ten limit rules of rulesDoc beside
// the limits: seventeen counters a request.
func BenchmarkHandlerRules(b *testing.B) {
	backend := benchBackend()
	defer backend.Close()
	benchHandlerDoc(b, backend.URL, rulesDoc)
}

// streamBackend answers every request with a 50-delta chat completion stream that
// reports its usage.
func streamBackend() *httptest.Server {
	var sb strings.Builder
	for i := 0; i < 50; i++ {
		sb.WriteString(`data: {"id":"chatcmpl-x","object":"chat.completion.chunk","created":1730000000,"model":"gpt-4o","choices":[{"index":0,"delta":{"content":" word"},"finish_reason":null}]}` + "\n\n")
	}
	sb.WriteString(`data: {"id":"chatcmpl-x","object":"chat.completion.chunk","created":1730000000,"model":"gpt-4o","choices":[],"usage":{"prompt_tokens":20,"completion_tokens":50}}` + "\n\ndata: [DONE]\n\n")
	body := []byte(sb.String())
	return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = w.Write(body)
	}))
}

// BenchmarkHandlerStream is BenchmarkHandler with a streamed answer of 50 deltas.
func BenchmarkHandlerStream(b *testing.B) {
	backend := streamBackend()
	defer backend.Close()
	benchHandler(b, backend.URL)
}

// BenchmarkHandlerGzip is BenchmarkHandler with a gzip answer, as a client that
// accepts gzip gets from many providers: the answer is decoded beside the copy.
func BenchmarkHandlerGzip(b *testing.B) {
	var zb strings.Builder
	zw := gzip.NewWriter(&zb)
	_, _ = zw.Write([]byte(`{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hello"}}],"usage":{"prompt_tokens":20,"completion_tokens":5}}`))
	_ = zw.Close()
	body := []byte(zb.String())
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Encoding", "gzip")
		_, _ = w.Write(body)
	}))
	defer backend.Close()
	benchHandler(b, backend.URL, "Accept-Encoding", "gzip, deflate")
}

// BenchmarkHandlerScheduled is BenchmarkHandler with the upstream declaring a capacity
// it never reaches: the scheduler's cost below capacity.
func BenchmarkHandlerScheduled(b *testing.B) {
	backend := benchBackend()
	defer backend.Close()
	doc := strings.Replace(benchDoc, "url: UPSTREAM}", "url: UPSTREAM, capacity: {max_in_flight_requests: 100000, max_in_flight_tokens: 1000000000}}", 1)
	benchHandlerOn(b, newBenchServerDoc(b, backend.URL, doc))
}

// benchHandler sends benchRequest through the handler in front of backend, from
// parallel goroutines, with extra header pairs.
func benchHandler(b *testing.B, backend string, header ...string) {
	benchHandlerDoc(b, backend, benchDoc, header...)
}

// benchHandlerDoc is benchHandler on a document of its own.
func benchHandlerDoc(b *testing.B, backend, doc string, header ...string) {
	benchHandlerOn(b, newBenchServerDoc(b, backend, doc), header...)
}

// benchHandlerOn is benchHandler on a server of the caller's.
func benchHandlerOn(b *testing.B, srv *server.Server, header ...string) {
	b.ReportAllocs()
	b.ResetTimer()
	cpu := processCPU()
	defer func() {
		if cpu := processCPU() - cpu; cpu > 0 && b.N > 0 {
			b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N)/1000, "cpu-µs/op")
		}
	}()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			req := httptest.NewRequest("POST", "/v1/chat/completions", strings.NewReader(benchRequest))
			req.Header.Set("Authorization", "Bearer sk-alice")
			for i := 0; i+1 < len(header); i += 2 {
				req.Header.Set(header[i], header[i+1])
			}
			w := httptest.NewRecorder()
			srv.ServeHTTP(w, req)
			if w.Code != 200 {
				b.Fatalf("status %d", w.Code)
			}
		}
	})
}

// bareReverseProxy is the baseline of the whole-proxy benchmarks: an
// httputil.ReverseProxy to target with the same connection pool as the proxy's
// upstream transport, so a comparison measures the proxy's own work and not transport
// tuning.
func bareReverseProxy(target *url.URL) *httptest.Server {
	rp := httputil.NewSingleHostReverseProxy(target)
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConns, tr.MaxIdleConnsPerHost = 1024, 256
	rp.Transport = tr
	return httptest.NewServer(rp)
}

// closeRow ends one run of a whole-proxy benchmark's row, deferred first so that it
// runs after the row's front server is closed: it closes every connection the backend
// still holds, the proxy's idle upstream connections among them, so that no row runs
// beside the goroutines, pools and buffers of the rows before it.
func closeRow(backend *httptest.Server) {
	backend.CloseClientConnections()
}
