// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package ledger_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/proxy/budget/redisstore"
	"github.com/tokenwarden/tokenwarden/proxy/ledger"
	"github.com/tokenwarden/tokenwarden/proxy/metrics"
	"github.com/tokenwarden/tokenwarden/proxy/server"
	"github.com/tokenwarden/tokenwarden/proxy/settlement"
	"github.com/tokenwarden/tokenwarden/test/fakellm"
	"github.com/tokenwarden/tokenwarden/test/redisserver"
)

// proxyDoc is one proxy whose dollar budget governs gpt-4o only: gpt-4o-mini is
// priced, and governed by no cost budget. ops_admin is a platform key whose name
// has an underscore; carol is a key of the tenant tenant-c. The cache answers
// again what it stored.
const proxyDoc = `
upstreams: [{name: fake, url: "%s"}]
models:
- {name: gpt-4o, price: {input: 2, output: 10}}
- {name: gpt-4o-mini, price: {input: 1, output: 4}}
api_keys:
- {name: ops_admin, key_sha256: "%s", user: ops, team: platform}
- {name: tenant-c_carol, key_sha256: "%s", user: carol, team: research, tenant: tenant-c}
rate_limiting:
  storage: redis
  redis: {url: "%s"}
  budget_division: {replicas: 1}
  rules:
  - {name: gpt-4o-dollars, dimension: global, amount: cost, models: [gpt-4o], windows: [{limit: 1000000, calendar: {every: month}}]}
cache: {storage: memory}
ledger: {fleet: llm/edge}
`

// aProxy is a running proxy with its ledger, on the suite's PostgreSQL.
type aProxy struct {
	srv   *server.Server
	l     *ledger.Ledger
	m     *metrics.Metrics
	front *httptest.Server
	url   string
}

// startProxy starts a proxy recording into a new database through a spool of one
// byte (no batch fits), flushed only when the spec says.
func startProxy(policy ledger.FullPolicy) *aProxy {
	backend := httptest.NewServer(fakellm.New())
	DeferCleanup(backend.Close)
	url := pg.NewDatabase(GinkgoT())
	log := slog.New(slog.NewTextHandler(GinkgoWriter, &slog.HandlerOptions{Level: slog.LevelWarn}))
	l, err := ledger.New(ledger.Config{Sink: &ledger.Lazy{URL: url, Retry: time.Millisecond}, Pod: "edge-proxy-0",
		SpoolDir: GinkgoT().TempDir(), SpoolBytes: 1, FlushInterval: -1, WhenFull: policy, Logger: log})
	Expect(err).NotTo(HaveOccurred())
	rs := redisserver.Start(GinkgoT())
	m := metrics.New(prometheus.NewRegistry())
	store, err := redisstore.New(redisstore.Options{URL: rs.URL(), Recorder: m, Logger: log})
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(store.Close)
	srv := server.New(server.Options{Store: store, Memory: budget.NewMemory(budget.SystemClock{}, 1000), Metrics: m, Logger: log,
		Observers: []settlement.Observer{&ledger.Observer{Ledger: l, Fleet: "llm/edge"}}})
	_, err = srv.Apply(fmt.Appendf(nil, proxyDoc, backend.URL, sha("sk-ops"), sha("sk-carol"), rs.URL()), "test")
	Expect(err).NotTo(HaveOccurred())
	p := &aProxy{srv: srv, l: l, m: m, front: httptest.NewServer(srv), url: url}
	DeferCleanup(func() {
		p.front.Close()
		_ = l.Close(context.Background())
	})
	return p
}

// reply is what a client got.
type reply struct {
	status int
	header http.Header
	body   map[string]any
}

// call sends one request with known usage on route (OpenAI's or Anthropic's).
func (p *aProxy) call(route, key, model string, i int) reply {
	body := fmt.Sprintf(`{"model":%q,"max_tokens":64,"messages":[{"role":"user","content":"request %d"}]}`, model, i)
	req, err := http.NewRequest(http.MethodPost, p.front.URL+route, strings.NewReader(body))
	Expect(err).NotTo(HaveOccurred())
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set(fakellm.HeaderBehaviour, fmt.Sprintf(`{"InputTokens":%d,"OutputTokens":%d}`, 100+i, 10+i))
	resp, err := http.DefaultClient.Do(req)
	Expect(err).NotTo(HaveOccurred())
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	Expect(err).NotTo(HaveOccurred())
	r := reply{status: resp.StatusCode, header: resp.Header}
	Expect(json.Unmarshal(raw, &r.body)).To(Succeed(), "%s", raw)
	return r
}

// report is the ledger's report of the spec's hour, grouped by g.
func (p *aProxy) report(g ...ledger.Dimension) []ledger.ReportRow {
	sink, err := ledger.Open(context.Background(), p.url)
	Expect(err).NotTo(HaveOccurred())
	defer sink.Close()
	rows, err := sink.Report(context.Background(), ledger.Query{From: time.Now().Add(-time.Hour), To: time.Now().Add(time.Hour), GroupBy: g})
	Expect(err).NotTo(HaveOccurred())
	return rows
}

var _ = Describe("a proxy whose ledger database is unreachable and whose spool is full", func() {
	It("under whenSpoolFull: Refuse, refuses with 503 what a cost budget governs, serves the rest, and records every request it served", func() {
		p := startProxy(ledger.Refuse)
		Expect(p.call("/v1/chat/completions", "sk-ops", "gpt-4o", 1).status).To(Equal(200))
		Expect(p.l.Flush(context.Background())).To(Succeed())

		By("the database down: the batch finds no room in the spool")
		Expect(pg.Stop("fast")).To(Succeed())
		DeferCleanup(func() { _ = pg.Start() })
		Expect(p.call("/v1/chat/completions", "sk-ops", "gpt-4o", 2).status).To(Equal(200))
		Expect(p.l.Flush(context.Background())).To(HaveOccurred())
		Expect(p.l.Full()).To(BeTrue())

		openai := p.call("/v1/chat/completions", "sk-ops", "gpt-4o", 3)
		Expect(openai.status).To(Equal(http.StatusServiceUnavailable))
		Expect(openai.header.Get("Retry-After")).To(Equal("10"), "a flush interval")
		e := openai.body["error"].(map[string]any)
		Expect(e["code"]).To(Equal("spend_unrecordable"))
		Expect(e["limit_type"]).To(Equal("ledger"))
		Expect(e["message"]).To(ContainSubstring("spend ledger cannot record"))
		anthropic := p.call("/v1/messages", "sk-carol", "gpt-4o", 4)
		Expect(anthropic.status).To(Equal(http.StatusServiceUnavailable))
		Expect(anthropic.body["type"]).To(Equal("error"), "Anthropic's shape on its route")
		Expect(anthropic.body["error"].(map[string]any)["limit_type"]).To(Equal("ledger"))

		By("a model no cost budget governs is served, and so is an answer from the response cache, which costs nothing")
		Expect(p.call("/v1/chat/completions", "sk-ops", "gpt-4o-mini", 5).status).To(Equal(200))
		hit := p.call("/v1/chat/completions", "sk-ops", "gpt-4o", 1)
		Expect(hit.status).To(Equal(200))
		Expect(hit.header.Get("X-Tokenwarden-Cache")).To(Equal("hit"))

		By("the refusals counted and audited")
		Expect(p.l.Stats().Refused).To(Equal(int64(2)))
		Expect(testutil.ToFloat64(p.m.Requests.WithLabelValues("/v1/chat/completions", "503"))).To(Equal(1.0))
		audit := p.srv.Refusals("ops_admin", false)
		Expect(audit).To(HaveLen(1))
		Expect(audit[0].Refusals).To(HaveLen(1))
		Expect(audit[0].Refusals[0].Limit).To(Equal("ledger"))
		Expect(audit[0].Refusals[0].RetryAfterSeconds).To(Equal(int64(10)))

		By("the database back: every request served is recorded, none dropped")
		Expect(pg.Start()).To(Succeed())
		Expect(p.l.Flush(context.Background())).To(Succeed())
		Expect(p.l.Refusing()).To(BeFalse())
		Expect(p.call("/v1/chat/completions", "sk-ops", "gpt-4o", 6).status).To(Equal(200))
		Expect(p.l.Flush(context.Background())).To(Succeed())
		Expect(p.l.Stats().Dropped).To(Equal(ledger.Dropped{}))
		rows := p.report(ledger.Model)
		Expect(rows).To(HaveLen(2))
		Expect(rows[0].Group[ledger.Model]).To(Equal("gpt-4o"))
		Expect(rows[0].Requests).To(Equal(int64(4)), "requests 1, 2 and 6, and the hit of 1")
		Expect(rows[0].CacheHits).To(Equal(int64(1)))
		Expect(rows[0].InputTokens).To(Equal(int64(101 + 102 + 106)))
		Expect(rows[1].Requests).To(Equal(int64(1)), "request 5")
	})

	It("under whenSpoolFull: KeepServing (the default), serves every request and counts what it could not record", func() {
		p := startProxy("")
		Expect(pg.Stop("fast")).To(Succeed())
		DeferCleanup(func() { _ = pg.Start() })
		Expect(p.call("/v1/chat/completions", "sk-ops", "gpt-4o", 1).status).To(Equal(200))
		Expect(p.l.Flush(context.Background())).To(HaveOccurred())
		Expect(p.l.Full()).To(BeTrue())
		Expect(p.call("/v1/chat/completions", "sk-ops", "gpt-4o", 2).status).To(Equal(200))
		Expect(p.call("/v1/messages", "sk-carol", "gpt-4o", 3).status).To(Equal(200))
		Expect(p.l.Flush(context.Background())).To(HaveOccurred())
		st := p.l.Stats()
		Expect(st.Refused).To(BeZero())
		Expect(st.Dropped.Requests).To(Equal(int64(3)), "counted, not recorded")
		Expect(st.Dropped.InputTokens).To(Equal(int64(101 + 102 + 103)))
	})
})

var _ = Describe("what a proxy records of each request", func() {
	It("records a key's tenant from the config, the platform's keys under none, and a cache hit as a request that cost nothing with what it saved", func() {
		p := startProxy("")
		Expect(p.call("/v1/chat/completions", "sk-ops", "gpt-4o", 1).status).To(Equal(200))
		Expect(p.call("/v1/chat/completions", "sk-carol", "gpt-4o-mini", 2).status).To(Equal(200))
		hit := p.call("/v1/chat/completions", "sk-carol", "gpt-4o-mini", 2)
		Expect(hit.status).To(Equal(200))
		Expect(hit.header.Get("X-Tokenwarden-Cache")).To(Equal("hit"))
		Expect(p.l.Flush(context.Background())).To(Succeed())

		rows := p.report(ledger.Tenant, ledger.APIKey)
		Expect(rows).To(HaveLen(2))
		platform, tenant := rows[0], rows[1]
		Expect(platform.Group).To(Equal(map[ledger.Dimension]string{ledger.Tenant: "", ledger.APIKey: "ops_admin"}), "a platform key, whatever its name")
		Expect(platform.Requests).To(Equal(int64(1)))
		Expect(tenant.Group).To(Equal(map[ledger.Dimension]string{ledger.Tenant: "tenant-c", ledger.APIKey: "tenant-c_carol"}))
		cost := int64(102*1 + 12*4) // micro-dollars at $1 and $4 a million tokens
		Expect(tenant.Sums).To(Equal(ledger.Sums{Requests: 2, InputTokens: 102, OutputTokens: 12, CostMicros: cost,
			CacheHits: 1, SavedInput: 102, SavedOutput: 12, SavedMicros: cost}), "the hit cost nothing and saved the miss's usage")
	})
})
