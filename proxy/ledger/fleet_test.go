// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package ledger_test

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/proxy/budget/redisstore"
	"github.com/tokenwarden/tokenwarden/proxy/ledger"
	"github.com/tokenwarden/tokenwarden/proxy/metrics"
	"github.com/tokenwarden/tokenwarden/proxy/server"
	"github.com/tokenwarden/tokenwarden/proxy/settlement"
	"github.com/tokenwarden/tokenwarden/test/fakellm"
	"github.com/tokenwarden/tokenwarden/test/redisserver"
)

// fleetDoc is a fleet of three on one Redis, whose prices make every request's cost
// whole micro-dollars, and whose two calendar rules count the fleet's dollars and
// tokens: the counters the ledger must agree with.
const fleetDoc = `
upstreams: [{name: fake, url: "%s"}]
models:
- {name: gpt-4o, price: {input: 2, output: 10, cached_input: 1}}
- {name: gpt-4o-mini, price: {input: 1, output: 4}}
api_keys:
- {name: alice, key_sha256: "%s", user: alice, team: search}
- {name: tenant-b_bob, key_sha256: "%s", user: bob, team: ads, tenant: tenant-b}
rate_limiting:
  storage: redis
  redis: {url: "%s"}
  budget_division: {replicas: 3}
  rules:
  - {name: fleet-dollars, dimension: global, amount: cost, windows: [{limit: 1000000, calendar: {every: month}}]}
  - {name: fleet-tokens, dimension: global, amount: tokens, windows: [{limit: 1000000000, calendar: {every: month}}]}
ledger: {fleet: llm/fleet}
`

func sha(s string) string { h := sha256.Sum256([]byte(s)); return hex.EncodeToString(h[:]) }

// fleetProxy is one replica: a server on the shared Redis with its ledger observer.
type fleetProxy struct {
	srv   *server.Server
	store *redisstore.Store
	l     *ledger.Ledger
	front *httptest.Server
}

var _ = Describe("a fleet of proxies on one PostgreSQL ledger", func() {
	It("records exactly what the counters charged, across an outage of the database and a restart with a spool to replay", func() {
		ctx := context.Background()
		rs := redisserver.Start(GinkgoT())
		backend := httptest.NewServer(fakellm.New())
		DeferCleanup(backend.Close)
		url := pg.NewDatabase(GinkgoT())
		doc := fmt.Sprintf(fleetDoc, backend.URL, sha("sk-alice"), sha("sk-bob"), rs.URL())
		log := slog.New(slog.NewTextHandler(GinkgoWriter, &slog.HandlerOptions{Level: slog.LevelWarn}))
		spools := []string{GinkgoT().TempDir(), GinkgoT().TempDir(), GinkgoT().TempDir()}

		start := func(i int) *fleetProxy {
			m := metrics.New(prometheus.NewRegistry())
			store, err := redisstore.New(redisstore.Options{URL: rs.URL(), Recorder: m, Logger: log})
			Expect(err).NotTo(HaveOccurred())
			l, err := ledger.New(ledger.Config{Sink: &ledger.Lazy{URL: url, Retry: 50 * time.Millisecond}, Pod: fmt.Sprintf("fleet-proxy-%d", i),
				SpoolDir: spools[i], FlushInterval: 50 * time.Millisecond, Logger: log})
			Expect(err).NotTo(HaveOccurred())
			srv := server.New(server.Options{Store: store, Memory: budget.NewMemory(budget.SystemClock{}, 1000), Metrics: m, Logger: log,
				AsyncSettle: true, Observers: []settlement.Observer{&ledger.Observer{Ledger: l, Fleet: "llm/fleet"}}})
			_, err = srv.Apply([]byte(doc), "test")
			Expect(err).NotTo(HaveOccurred())
			return &fleetProxy{srv: srv, store: store, l: l, front: httptest.NewServer(srv)}
		}
		stop := func(p *fleetProxy) error {
			p.front.Close()
			wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			Expect(p.srv.WaitSettled(wctx)).To(Succeed())
			err := p.l.Close(wctx) // the drain: the spool first
			_ = p.store.Close()
			return err
		}
		proxies := []*fleetProxy{start(0), start(1), start(2)}

		// traffic sends n requests to every proxy at once: plain answers, streams, streams
		// the upstream cuts, and streams whose client leaves after the first event.
		traffic := func(n int) {
			var wg sync.WaitGroup
			for pi, p := range proxies {
				for i := range n {
					wg.Go(func() {
						defer GinkgoRecover()
						send(p.front.URL, pi*1000+i)
					})
				}
			}
			wg.Wait()
		}

		traffic(40)
		By("the database down: the proxies serve on and spool")
		Expect(pg.Stop("fast")).To(Succeed())
		traffic(40)
		Eventually(func() int { return proxies[1].l.Stats().SpoolBatches }).Should(BeNumerically(">", 0))

		By("proxy 1 restarted while its spool waits: its drain cannot flush it, its next process replays it")
		Expect(stop(proxies[1])).To(MatchError(ContainSubstring("remain in the spool")))
		proxies[1] = start(1)
		Expect(proxies[1].l.Stats().SpoolBatches).To(BeNumerically(">", 0), "the spool on the pod's disk")
		traffic(20)

		By("the database back")
		Expect(pg.Start()).To(Succeed())
		traffic(40)
		var lost int64
		for _, p := range proxies {
			Expect(stop(p)).To(Succeed())
			st := p.l.Stats()
			lost += st.Dropped.Requests + st.Expired.Requests
		}
		Expect(lost).To(BeZero())

		sink, err := ledger.Open(ctx, url)
		Expect(err).NotTo(HaveOccurred())
		defer sink.Close()
		rows, err := sink.Report(ctx, ledger.Query{From: time.Now().Add(-time.Hour), To: time.Now().Add(time.Hour)})
		Expect(err).NotTo(HaveOccurred())
		Expect(rows).To(HaveLen(1))
		recorded := rows[0].Sums
		dollars, tokens := countersOf(ctx, rs.URL())
		Expect(recorded.CostMicros).To(Equal(budget.MicroDollars(dollars)), "the ledger's dollars are the counter's")
		Expect(recorded.InputTokens+recorded.OutputTokens).To(Equal(int64(tokens)), "the ledger's tokens are the counter's")
		Expect(recorded.Requests).To(BeNumerically(">=", 3*140-3*140/4), "every request but the cuts at the start is settled")
		GinkgoWriter.Printf("recorded %d requests, %d tokens, %s dollars\n", recorded.Requests, recorded.InputTokens+recorded.OutputTokens, ledger.Dollars(recorded.CostMicros))

		byTenant, err := sink.Report(ctx, ledger.Query{From: time.Now().Add(-time.Hour), To: time.Now().Add(time.Hour), GroupBy: []ledger.Dimension{ledger.Tenant}})
		Expect(err).NotTo(HaveOccurred())
		Expect(byTenant).To(HaveLen(2))
		Expect([]string{byTenant[0].Group[ledger.Tenant], byTenant[1].Group[ledger.Tenant]}).To(Equal([]string{"", "tenant-b"}), "the platform's own key has no tenant")
	})
})

// send sends request i: its kind and size follow from i.
func send(front string, i int) {
	key := []string{"sk-alice", "sk-bob"}[i%2]
	model := []string{"gpt-4o", "gpt-4o-mini"}[(i/2)%2]
	kind := i % 4
	behaviour := fmt.Sprintf(`{"InputTokens":%d,"OutputTokens":%d,"CachedTokens":%d}`, 100+2*(i%50), 5+i%17, 2*(i%3)*10)
	stream := kind != 0
	if kind == 2 {
		behaviour = fmt.Sprintf(`{"InputTokens":%d,"OutputTokens":%d,"CutAfter":3}`, 100+2*(i%50), 5+i%17)
	}
	body := fmt.Sprintf(`{"model":%q,"max_tokens":64,"stream":%t,"messages":[{"role":"user","content":"request %d"}]}`, model, stream, i)
	req, err := http.NewRequest(http.MethodPost, front+"/v1/chat/completions", strings.NewReader(body))
	Expect(err).NotTo(HaveOccurred())
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set(fakellm.HeaderBehaviour, behaviour)
	resp, err := http.DefaultClient.Do(req)
	Expect(err).NotTo(HaveOccurred())
	defer resp.Body.Close()
	Expect(resp.StatusCode).To(Equal(http.StatusOK), "request %d", i)
	if kind == 3 { // the client leaves after the first event
		_, _ = bufio.NewReader(resp.Body).ReadString('\n')
		return
	}
	_, _ = io.Copy(io.Discard, resp.Body)
}

// countersOf reads the fleet's two calendar counters from Redis: the dollars and
// tokens spent this month.
func countersOf(ctx context.Context, redisURL string) (dollars, tokens float64) {
	s, err := redisstore.New(redisstore.Options{URL: redisURL})
	Expect(err).NotTo(HaveOccurred())
	defer s.Close()
	Expect(s.EachLevel(ctx, func(k budget.Key, level, capacity float64) {
		switch k.Rule {
		case "fleet-dollars":
			dollars += capacity - level
		case "fleet-tokens":
			tokens += capacity - level
		}
	})).To(Succeed())
	return dollars, tokens
}
