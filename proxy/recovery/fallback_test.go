// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package recovery_test

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/proxy/budget/redisstore"
	"github.com/tokenwarden/tokenwarden/proxy/ledger"
	"github.com/tokenwarden/tokenwarden/proxy/recovery"
	"github.com/tokenwarden/tokenwarden/test/fakellm"
	"github.com/tokenwarden/tokenwarden/test/redisserver"
)

// fallbackDoc is a fleet of three whose keys have dollar budgets a month, and whose
// gpt-4o-mini traffic is under a budget by model, which the ledger fallback does
// not answer. %s: the backend, two keys' hashes, Redis' URL; %v: alice's budget.
const fallbackDoc = `
upstreams: [{name: fake, url: "%s"}]
models:
- {name: gpt-4o, price: {input: 2, output: 10}}
- {name: gpt-4o-mini, price: {input: 1, output: 2}}
api_keys:
- {name: alice, key_sha256: "%s", user: alice, team: search}
- {name: bob, key_sha256: "%s", user: bob, team: ads}
rate_limiting:
  storage: redis
  redis: {url: "%s", ledger_fallback: {}}
  budget_division: {replicas: 3}
  rules:
  - {name: key-dollars, dimension: api_key, amount: cost, windows: [{limit: %v, calendar: {every: month}}]}
  - {name: mini-dollars, dimension: model, amount: cost, models: [gpt-4o-mini], windows: [{limit: 1000, calendar: {every: month}}]}
ledger: {fleet: llm/fleet}
`

// Each request reports 100 tokens in and 20 out: $0.0004 at gpt-4o's prices. It
// reserves its estimate and its 64 tokens of max_tokens: at most maxReservation.
const (
	requestCost    = 0.0004
	maxReservation = 0.0008
)

// fbReplica is one proxy of a fleet with the ledger fallback.
type fbReplica struct {
	proxy
	fallback *recovery.Fallback
}

// fbFleet is a fallback spec's world: Redis, one PostgreSQL database, replicas.
type fbFleet struct {
	ctx      context.Context
	rs       *redisserver.Server
	backend  *httptest.Server
	url      string
	sink     *ledger.SQLSink
	replicas []*fbReplica
	log      *slog.Logger
}

func newFallbackFleet(n int, budgetUSD float64, maxConcurrent int) *fbFleet {
	f := &fbFleet{ctx: context.Background(), rs: redisserver.Start(GinkgoT()),
		log: slog.New(slog.NewTextHandler(GinkgoWriter, &slog.HandlerOptions{Level: slog.LevelWarn}))}
	f.backend = httptest.NewServer(fakellm.New())
	DeferCleanup(f.backend.Close)
	f.url = pg.NewDatabase(GinkgoT())
	var err error
	f.sink, err = ledger.Open(f.ctx, f.url)
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(f.sink.Close)
	doc := fmt.Appendf(nil, fallbackDoc, f.backend.URL, sha("sk-alice"), sha("sk-bob"), f.rs.URL(), budgetUSD)
	for i := range n {
		f.replicas = append(f.replicas, f.start(i, doc, maxConcurrent))
	}
	return f
}

func (f *fbFleet) start(i int, doc []byte, maxConcurrent int) *fbReplica {
	// No flush but the spec's: what a replica holds unflushed is the spec's to say.
	r := &fbReplica{proxy: startProxy(f.ctx, i, f.rs.URL(), f.url, redisstore.CheckOptions{}, -1, doc, f.log)}
	r.fallback = &recovery.Fallback{Report: r.sink.Report, Pending: r.l.Pending, Fleet: "llm/fleet", Replicas: 3, MaxConcurrent: maxConcurrent, Log: f.log}
	r.fallback.Register(prometheus.NewRegistry())
	r.store.SetDurableFallback(r.fallback)
	return r
}

// answer is what a client saw.
type answer struct {
	status     int
	retryAfter string
	body       string
	took       time.Duration
}

// ask sends one chat completion with key k for model.
func ask(front, k, model string, i int) answer {
	body := fmt.Sprintf(`{"model":%q,"max_tokens":64,"messages":[{"role":"user","content":"request %d"}]}`, model, i)
	req, err := http.NewRequest(http.MethodPost, front+"/v1/chat/completions", strings.NewReader(body))
	Expect(err).NotTo(HaveOccurred())
	req.Header.Set("Authorization", "Bearer "+k)
	req.Header.Set(fakellm.HeaderBehaviour, `{"InputTokens":100,"OutputTokens":20,"Latency":20000000}`)
	start := time.Now()
	resp, err := http.DefaultClient.Do(req)
	Expect(err).NotTo(HaveOccurred())
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return answer{status: resp.StatusCode, retryAfter: resp.Header.Get("Retry-After"), body: string(b), took: time.Since(start)}
}

// flushAll waits for every replica's settlements and flushes its ledger.
func (f *fbFleet) flushAll() {
	GinkgoHelper()
	for _, r := range f.replicas {
		f.flush(r)
	}
}

// spent is what the ledger holds of alice's dollars this month.
func (f *fbFleet) spent() float64 {
	now := time.Now().UTC()
	from := time.Date(now.Year(), now.Month(), 1, 0, 0, 0, 0, time.UTC)
	rows, err := f.sink.Report(f.ctx, ledger.Query{From: from, To: now.Add(time.Hour), Where: map[ledger.Dimension]string{ledger.APIKey: "alice"}})
	Expect(err).NotTo(HaveOccurred())
	total := 0.0
	for _, r := range rows {
		total += float64(r.CostMicros) / 1e6
	}
	return total
}

// lockLedger holds an exclusive lock on the rollups, so that every sum waits, until
// the returned function lets it go.
func (f *fbFleet) lockLedger() func() {
	db, err := sql.Open("pgx", f.url)
	Expect(err).NotTo(HaveOccurred())
	tx, err := db.BeginTx(f.ctx, nil)
	Expect(err).NotTo(HaveOccurred())
	_, err = tx.ExecContext(f.ctx, "LOCK TABLE ledger_rollups IN ACCESS EXCLUSIVE MODE")
	Expect(err).NotTo(HaveOccurred())
	var once sync.Once
	release := func() {
		once.Do(func() {
			_ = tx.Rollback()
			_ = db.Close()
		})
	}
	DeferCleanup(release)
	return release
}

// waiting counts the ledger's sums waiting for the lock.
func (f *fbFleet) waiting() int {
	db := f.sink.DB()
	var n int
	Expect(db.QueryRowContext(f.ctx, "SELECT count(*) FROM pg_locks WHERE NOT granted").Scan(&n)).To(Succeed())
	return n
}

var _ = Describe("The ledger fallback while Redis is unreachable", func() {
	It("admits a key's dollars from the ledger across three proxies, within the budget plus what was in flight", func() {
		const budgetUSD = 0.06
		f := newFallbackFleet(3, budgetUSD, 0)
		var ok, refused, other, inflight, maxInflight atomic.Int64
		var okAfterKill atomic.Int64
		var killed atomic.Bool
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for ri, r := range f.replicas {
			for w := range 2 {
				wg.Go(func() {
					defer GinkgoRecover()
					for i := 0; ; i++ {
						select {
						case <-stop:
							return
						default:
						}
						n := inflight.Add(1)
						for m := maxInflight.Load(); n > m && !maxInflight.CompareAndSwap(m, n); m = maxInflight.Load() {
						}
						a := ask(r.front.URL, "sk-alice", "gpt-4o", ri*100000+w*1000+i)
						inflight.Add(-1)
						switch a.status {
						case http.StatusOK:
							ok.Add(1)
							if killed.Load() {
								okAfterKill.Add(1)
							}
						case http.StatusTooManyRequests:
							refused.Add(1)
						default:
							other.Add(1)
						}
					}
				})
			}
		}
		DeferCleanup(func() {
			select {
			case <-stop:
			default:
				close(stop)
			}
			wg.Wait()
		})
		// On Redis a while; part of it in the ledger, the rest still each replica's.
		Eventually(ok.Load).Should(BeNumerically(">=", 20))
		for _, r := range f.replicas {
			Expect(r.l.Flush(f.ctx)).To(Succeed())
		}
		Eventually(ok.Load).Should(BeNumerically(">=", 40))
		Expect(refused.Load()).To(BeZero())

		Expect(f.rs.Kill()).To(Succeed())
		killed.Store(true)
		// Each replica spends its share of what remains, then refuses with 429. A
		// refusal comes while the replica's other worker holds a reservation, so once
		// the workers stop, each replica is filled by one client to its first 429,
		// nothing else in flight.
		Eventually(refused.Load, 30*time.Second).Should(BeNumerically(">=", 30))
		close(stop)
		wg.Wait()
		for ri, r := range f.replicas {
			for i := 0; ; i++ {
				Expect(i).To(BeNumerically("<", 200), "replica %d never refused", ri)
				if a := ask(r.front.URL, "sk-alice", "gpt-4o", ri*100000+900000+i); a.status != http.StatusOK {
					Expect(a.status).To(Equal(http.StatusTooManyRequests))
					break
				}
				ok.Add(1)
				okAfterKill.Add(1)
			}
		}
		f.flushAll()

		spent := f.spent()
		open := float64(maxInflight.Load()) * maxReservation
		GinkgoWriter.Printf("admitted %d (%d with Redis down), refused %d, other %d; spent $%.6f of $%.2f; at most %d in flight\n",
			ok.Load(), okAfterKill.Load(), refused.Load(), other.Load(), spent, budgetUSD, maxInflight.Load())
		Expect(okAfterKill.Load()).To(BeNumerically(">", 0), "the cost budget answered from the ledger while Redis was down")
		Expect(other.Load()).To(BeZero(), "no request failed closed")
		// The documented bound: the budget, plus the reservations open when each
		// replica first read the ledger (nothing flushed between the reads here).
		Expect(spent).To(BeNumerically("<=", budgetUSD+open+1e-9))
		// Each replica, filled with nothing else in flight, stops within one
		// reservation of its share.
		Expect(spent).To(BeNumerically(">=", budgetUSD-3*maxReservation-1e-9))
	})

	It("answers 503 with Retry-After once a sum takes a second, and admits once the ledger answers", func() {
		f := newFallbackFleet(1, 1, 0)
		front := f.replicas[0].front.URL
		Expect(ask(front, "sk-alice", "gpt-4o", 0).status).To(Equal(http.StatusOK))
		Expect(f.rs.Kill()).To(Succeed())
		release := f.lockLedger()
		a := ask(front, "sk-alice", "gpt-4o", 1)
		Expect(a.status).To(Equal(http.StatusServiceUnavailable))
		Expect(a.retryAfter).To(Equal("1"))
		Expect(a.body).To(ContainSubstring("budget_store_unavailable"))
		Expect(a.body).To(ContainSubstring("spend ledger"))
		Expect(a.took).To(BeNumerically(">=", 900*time.Millisecond))
		Expect(a.took).To(BeNumerically("<", 3*time.Second))
		release()
		Expect(ask(front, "sk-alice", "gpt-4o", 2).status).To(Equal(http.StatusOK))
	})

	It("answers 503 with Retry-After at once when every permit to read the ledger is taken", func() {
		f := newFallbackFleet(1, 1, 1)
		front := f.replicas[0].front.URL
		Expect(f.rs.Kill()).To(Succeed())
		release := f.lockLedger()
		first := make(chan answer, 1)
		go func() {
			defer GinkgoRecover()
			first <- ask(front, "sk-alice", "gpt-4o", 0)
		}()
		Eventually(f.waiting).Should(BeNumerically(">", 0), "alice's sum waits for the lock, holding the one permit")
		a := ask(front, "sk-bob", "gpt-4o", 1)
		Expect(a.status).To(Equal(http.StatusServiceUnavailable))
		Expect(a.retryAfter).To(Equal("1"))
		Expect(a.took).To(BeNumerically("<", 500*time.Millisecond))
		Expect((<-first).status).To(Equal(http.StatusServiceUnavailable))
		release()
		Expect(ask(front, "sk-bob", "gpt-4o", 2).status).To(Equal(http.StatusOK))
	})

	It("charges Redis, once it answers again with its counters, with what the fallback admitted", func() {
		f := newFallbackFleet(1, 1, 0)
		r := f.replicas[0]
		for i := range 5 {
			Expect(ask(r.front.URL, "sk-alice", "gpt-4o", i).status).To(Equal(http.StatusOK))
		}
		Expect(f.rs.Pause()).To(Succeed())
		for i := range 5 {
			Expect(ask(r.front.URL, "sk-alice", "gpt-4o", 10+i).status).To(Equal(http.StatusOK))
		}
		Expect(f.rs.Resume()).To(Succeed())
		Expect(r.srv.WaitSettled(f.ctx)).To(Succeed())
		alice := func() float64 {
			spent := 0.0
			Expect(r.store.EachLevel(f.ctx, func(k budget.Key, level, capacity float64) {
				if k.Rule == "key-dollars" && k.ID == "alice" {
					spent += capacity - level
				}
			})).To(Succeed())
			return spent
		}
		// The first admission on Redis again charges it with the outage's spend.
		Eventually(func() float64 {
			Expect(ask(r.front.URL, "sk-bob", "gpt-4o", 20).status).To(Equal(http.StatusOK))
			return alice()
			// The reservation that found Redis paused is applied when it resumes, as a
			// call that timed out may be: counted high, never low.
		}).Should(BeNumerically(">=", 10*requestCost-1e-9))
		Expect(alice()).To(BeNumerically("<=", 10*requestCost+maxReservation+1e-9))
	})

	It("keeps a budget the ledger cannot answer fail-closed", func() {
		f := newFallbackFleet(1, 1, 0)
		front := f.replicas[0].front.URL
		Expect(f.rs.Kill()).To(Succeed())
		Expect(ask(front, "sk-alice", "gpt-4o", 0).status).To(Equal(http.StatusOK))
		a := ask(front, "sk-bob", "gpt-4o-mini", 1)
		Expect(a.status).To(Equal(http.StatusServiceUnavailable))
		Expect(a.retryAfter).To(Equal("5"))
		Expect(a.body).To(ContainSubstring("budget_store_unavailable"))
	})
})
