// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package recovery_test

import (
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
	"sync/atomic"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/proxy/budget/redisstore"
	"github.com/tokenwarden/tokenwarden/proxy/config"
	"github.com/tokenwarden/tokenwarden/proxy/ledger"
	"github.com/tokenwarden/tokenwarden/proxy/ledger/ledgertest"
	"github.com/tokenwarden/tokenwarden/proxy/metrics"
	"github.com/tokenwarden/tokenwarden/proxy/recovery"
	"github.com/tokenwarden/tokenwarden/proxy/recovery/ready"
	"github.com/tokenwarden/tokenwarden/proxy/server"
	"github.com/tokenwarden/tokenwarden/proxy/settlement"
	"github.com/tokenwarden/tokenwarden/test/fakellm"
	"github.com/tokenwarden/tokenwarden/test/pgserver"
	"github.com/tokenwarden/tokenwarden/test/redisserver"
)

func TestRecovery(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "Recovery Suite")
}

// pg is the suite's PostgreSQL: each spec gets a database of its own.
var pg *pgserver.Server

var _ = BeforeSuite(func() {
	pg = pgserver.Start(GinkgoT())
	SetDefaultEventuallyTimeout(10 * time.Second) // a loaded machine serves slowly
})

// fleetDoc is a fleet of three on one Redis and one ledger, with durable rules that
// count dollars by the fleet, by key and by team, and the fleet's tokens in a month.
// %s: the backend, two keys' hashes, Redis' URL and what else its section says.
const fleetDoc = `
upstreams: [{name: fake, url: "%s"}]
models:
- {name: gpt-4o, price: {input: 2, output: 10, cached_input: 1}}
api_keys:
- {name: alice, key_sha256: "%s", user: alice, team: search}
- {name: bob, key_sha256: "%s", user: bob, team: ads}
rate_limiting:
  storage: redis
  redis: {url: "%s"%s}
  budget_division: {replicas: 3}
  rules:
  - {name: fleet-dollars, dimension: global, amount: cost, windows: [{limit: 1000, calendar: {every: month}}]}
  - {name: key-dollars, dimension: api_key, amount: cost, windows: [{limit: 100, calendar: {every: month}}]}
  - {name: team-dollars, dimension: team, amount: cost, windows: [{limit: 100, calendar: {every: day}}]}
  - {name: fleet-tokens, dimension: global, amount: tokens, windows: [{limit: 100000000, calendar: {every: month}}]}
%s
ledger: {fleet: llm/fleet}
`

// grace is the in-flight grace of the specs' orders: the fake backend answers at once.
const grace = 200 * time.Millisecond

func sha(s string) string { h := sha256.Sum256([]byte(s)); return hex.EncodeToString(h[:]) }

// proxy is what every replica of a spec runs: a server on the spec's Redis whose
// settlements go to its own ledger, on a sink the spec can take down.
type proxy struct {
	srv   *server.Server
	store *redisstore.Store
	l     *ledger.Ledger
	sink  *ledgertest.Outage
	front *httptest.Server
}

// startProxy starts replica i on Redis at redisURL (with checks) and the ledger
// database at dbURL, flushed every flush (-1: only when the spec flushes), serving doc
// at its front; it stops, its settlements waited for, when the spec ends.
func startProxy(ctx context.Context, i int, redisURL, dbURL string, checks redisstore.CheckOptions, flush time.Duration, doc []byte, log *slog.Logger) proxy {
	m := metrics.New(prometheus.NewRegistry())
	store, err := redisstore.New(redisstore.Options{URL: redisURL, Recorder: m, Logger: log, Checks: checks})
	Expect(err).NotTo(HaveOccurred())
	sink, err := ledger.Open(ctx, dbURL)
	Expect(err).NotTo(HaveOccurred())
	out := &ledgertest.Outage{Sink: sink}
	l, err := ledger.New(ledger.Config{Sink: out, Pod: fmt.Sprintf("proxy-%d", i), FlushInterval: flush, Logger: log})
	Expect(err).NotTo(HaveOccurred())
	srv := server.New(server.Options{Store: store, Memory: budget.NewMemory(budget.SystemClock{}, 1000), Metrics: m, Logger: log,
		AsyncSettle: true, Observers: []settlement.Observer{&ledger.Observer{Ledger: l, Fleet: "llm/fleet"}}})
	_, err = srv.Apply(doc, "test")
	Expect(err).NotTo(HaveOccurred())
	p := proxy{srv: srv, store: store, l: l, sink: out, front: httptest.NewServer(srv)}
	DeferCleanup(func() {
		p.front.Close()
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		_ = srv.WaitSettled(wctx)
		_ = l.Close(wctx)
		_ = store.Close()
		_ = sink.Close()
	})
	return p
}

// replica is one proxy of the fleet and its attester.
type replica struct {
	proxy
	attester *recovery.Attester
	reg      *prometheus.Registry
}

// fleet is the spec's world.
type fleet struct {
	ctx      context.Context
	rs       *redisserver.Server
	backend  *httptest.Server
	url      string
	replicas []*replica
	extra    string // a rule the spec adds
	checks   redisstore.CheckOptions
	log      *slog.Logger
}

func newFleet(extra string, checks redisstore.CheckOptions) *fleet {
	f := &fleet{ctx: context.Background(), rs: redisserver.Start(GinkgoT()), extra: extra, checks: checks,
		log: slog.New(slog.NewTextHandler(GinkgoWriter, &slog.HandlerOptions{Level: slog.LevelWarn}))}
	f.backend = httptest.NewServer(fakellm.New())
	DeferCleanup(f.backend.Close)
	f.url = pg.NewDatabase(GinkgoT())
	for i := range 3 {
		f.replicas = append(f.replicas, f.start(i))
	}
	return f
}

// doc is the fleet's config with redis set to what follows the URL.
func (f *fleet) doc(redisExtra string) []byte {
	return fmt.Appendf(nil, fleetDoc, f.backend.URL, sha("sk-alice"), sha("sk-bob"), f.rs.URL(), redisExtra, f.extra)
}

func (f *fleet) start(i int) *replica {
	r := &replica{proxy: startProxy(f.ctx, i, f.rs.URL(), f.url, f.checks, 50*time.Millisecond, f.doc(""), f.log), reg: prometheus.NewRegistry()}
	r.attester = &recovery.Attester{Source: r.srv, Store: r.store, Report: r.sink.Report, Fleet: "llm/fleet", Log: f.log, Retry: 100 * time.Millisecond}
	r.attester.Register(r.reg)
	ctx, cancel := context.WithCancel(f.ctx)
	go r.attester.Run(ctx)
	DeferCleanup(cancel)
	return r
}

// apply gives every replica the config with redis extra, as the operator renders it.
func (f *fleet) apply(redisExtra string) {
	for _, r := range f.replicas {
		cfg, err := r.srv.Apply(f.doc(redisExtra), "test")
		Expect(err).NotTo(HaveOccurred())
		r.attester.Order(cfg.RateLimiting.Redis.LedgerAttestation)
	}
}

// order is what the operator decides from the replicas' reports (their Leases).
func (f *fleet) order() (*config.LedgerAttestation, string) {
	var live []ready.Replica
	for i, r := range f.replicas {
		st := r.l.Stats()
		live = append(live, ready.Replica{Name: fmt.Sprint("proxy-", i), Epochs: r.store.Epochs(), Ledger: true, FlushedThrough: st.FlushedThrough})
	}
	return ready.Order(live, grace)
}

// orderOf renders an order into the redis section.
func orderOf(o *config.LedgerAttestation) string {
	return fmt.Sprintf(`, ledger_attestation: {epoch: %q, flushed_through_ms: %d}`, o.Epoch, o.FlushedThroughMillis)
}

// send sends one request with key k and returns its status and error code.
func send(front, k string, i int) (int, string) {
	body := fmt.Sprintf(`{"model":"gpt-4o","max_tokens":64,"messages":[{"role":"user","content":"request %d"}]}`, i)
	req, err := http.NewRequest(http.MethodPost, front+"/v1/chat/completions", strings.NewReader(body))
	Expect(err).NotTo(HaveOccurred())
	req.Header.Set("Authorization", "Bearer "+k)
	req.Header.Set(fakellm.HeaderBehaviour, fmt.Sprintf(`{"InputTokens":%d,"OutputTokens":%d,"CachedTokens":%d}`, 100+i%50, 5+i%17, 10*(i%3)))
	resp, err := http.DefaultClient.Do(req)
	Expect(err).NotTo(HaveOccurred())
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	code := ""
	if strings.Contains(string(b), "budget_recovering") {
		code = "budget_recovering"
	}
	return resp.StatusCode, code
}

// status sends one request and returns its status.
func status(front, k string, i int) int {
	st, _ := send(front, k, i)
	return st
}

// load sends requests to every replica from workers goroutines each until stopped,
// and counts the answers.
type load struct {
	stop             chan struct{}
	wg               sync.WaitGroup
	ok, recovering   atomic.Int64
	other, inflight  atomic.Int64
	workersPerTarget int
	once             sync.Once
}

func (f *fleet) load(workers int) *load {
	ld := &load{stop: make(chan struct{}), workersPerTarget: workers}
	for ri, r := range f.replicas {
		for w := range workers {
			ld.wg.Go(func() {
				defer GinkgoRecover()
				for i := 0; ; i++ {
					select {
					case <-ld.stop:
						return
					default:
					}
					ld.inflight.Add(1)
					status, code := send(r.front.URL, []string{"sk-alice", "sk-bob"}[(w+i)%2], ri*100000+w*1000+i)
					ld.inflight.Add(-1)
					switch {
					case status == http.StatusOK:
						ld.ok.Add(1)
					case status == http.StatusServiceUnavailable && code == "budget_recovering":
						ld.recovering.Add(1)
					default:
						ld.other.Add(1)
					}
				}
			})
		}
	}
	DeferCleanup(ld.end) // before the replicas stop, even when the spec fails
	return ld
}

func (ld *load) end() {
	ld.once.Do(func() { close(ld.stop) })
	ld.wg.Wait()
}

// flush empties Redis, as a restart without persistence does.
func (f *fleet) flush() {
	c := redis.NewClient(&redis.Options{Addr: f.rs.Addr()})
	defer c.Close()
	Expect(c.FlushAll(f.ctx).Err()).To(Succeed())
}

// fenced counts the replicas whose durable rules are fenced for a lost epoch.
func (f *fleet) fenced() int {
	n := 0
	for _, r := range f.replicas {
		for _, g := range r.store.Epochs() {
			if g.Fenced {
				n++
			}
		}
	}
	return n
}

// attested sums tokenwarden_durable_ledger_attestations_total{result} over the fleet.
func (f *fleet) attested(result string) float64 {
	total := 0.0
	for _, r := range f.replicas {
		mfs, err := r.reg.Gather()
		Expect(err).NotTo(HaveOccurred())
		for _, mf := range mfs {
			for _, m := range mf.GetMetric() {
				for _, lp := range m.GetLabel() {
					if lp.GetName() == "result" && lp.GetValue() == result {
						total += m.GetCounter().GetValue()
					}
				}
			}
		}
	}
	return total
}

// settle waits for every replica's settlements and flushes its ledger.
func (f *fleet) settle() {
	for _, r := range f.replicas {
		wctx, cancel := context.WithTimeout(f.ctx, 10*time.Second)
		Expect(r.srv.WaitSettled(wctx)).To(Succeed())
		Expect(r.l.Flush(wctx)).To(Succeed())
		cancel()
	}
}

// counters reads every durable counter's spend in Redis, by rule and subject.
func (f *fleet) counters() map[string]float64 {
	out := map[string]float64{}
	Expect(f.replicas[0].store.EachLevel(f.ctx, func(k budget.Key, level, capacity float64) {
		if k.Rule != "" {
			out[k.Rule+"/"+k.ID] += capacity - level
		}
	})).To(Succeed())
	return out
}

// ledgerSums are the same counters summed from the ledger.
func (f *fleet) ledgerSums() map[string]float64 {
	rules, w := f.replicas[0].srv.DurableRules()
	bs, err := recovery.Balances(f.ctx, f.replicas[0].sink.Report, "llm/fleet", rules, w)
	Expect(err).NotTo(HaveOccurred())
	out := map[string]float64{}
	for _, b := range bs {
		out[b.Rule+"/"+b.Subject] += b.Spent
	}
	return out
}

// epochOf is the epoch replica r runs under.
func epochOf(r *replica) string { return r.store.Epochs()[0].Epoch }

var _ = Describe("attestation from the spend ledger", func() {
	It("attests the fleet's counters on its own after Redis is flushed under load, once every spool is flushed past the loss, to the ledger's sums", func() {
		f := newFleet("", redisstore.CheckOptions{})
		ld := f.load(3)
		Eventually(ld.ok.Load).WithTimeout(20 * time.Second).Should(BeNumerically(">", 150))
		lost := epochOf(f.replicas[0])
		Expect(lost).NotTo(BeEmpty())

		By("Redis flushed under load: the fence trips on every replica")
		before := ld.inflight.Load()
		f.flush()
		Eventually(f.fenced).WithTimeout(10 * time.Second).Should(Equal(3))
		Eventually(ld.recovering.Load).Should(BeNumerically(">", 20))

		By("the operator's word once every live replica's ledger is flushed past the loss and the grace")
		var o *config.LedgerAttestation
		Eventually(func() string { var why string; o, why = f.order(); return why }).WithTimeout(10 * time.Second).Should(BeEmpty())
		Expect(o.Epoch).To(Equal(lost))
		f.apply(orderOf(o))

		By("one replica attests, under the claim; the others find it done")
		Eventually(func() float64 { return f.attested(recovery.Attested) }).WithTimeout(10 * time.Second).Should(Equal(1.0))
		var attester *replica
		for _, r := range f.replicas {
			if e := epochOf(r); e != lost {
				attester = r
			}
		}
		Expect(attester).NotTo(BeNil())
		next := epochOf(attester)
		f.apply(fmt.Sprintf(`, epoch: %q`, next)) // the operator records the new epoch
		Eventually(f.fenced).Should(BeZero())
		recovering := ld.recovering.Load()
		Eventually(ld.ok.Load).Should(BeNumerically(">", ld.ok.Load()+60), "the dollar budgets admit again")
		ld.end()
		Expect(f.attested(recovery.Attested)).To(Equal(1.0), "attested once")
		Expect(ld.other.Load()).To(BeZero())

		By("every counter within the in-flight bound of the ledger's sum")
		f.settle()
		counters, sums := f.counters(), f.ledgerSums()
		// What the counters can lack: the reservations of the requests open at the flush
		// (at most every worker's), each at most 200 input and 64 output tokens.
		bound := map[string]float64{"cost": float64(before+1) * (200*2 + 64*10) / 1e6, "tokens": float64(before+1) * (200 + 64)}
		Expect(sums).To(HaveLen(6), "the fleet, two keys and two teams in dollars, the fleet in tokens")
		for k, want := range sums {
			b := bound["cost"]
			if strings.HasPrefix(k, "fleet-tokens/") {
				b = bound["tokens"]
			}
			Expect(counters[k]).To(BeNumerically("<=", want+1e-9), "%s: never above the ledger", k)
			Expect(counters[k]).To(BeNumerically(">=", want-b), "%s: within the in-flight bound %v of the ledger's %v", k, b, want)
			GinkgoWriter.Printf("%s: counter %.6f, ledger %.6f, bound %.6f\n", k, counters[k], want, b)
		}
		GinkgoWriter.Printf("admitted %d, refused while recovering %d (last %d), in flight at the flush %d\n",
			ld.ok.Load(), ld.recovering.Load(), recovering, before)
	})

	It("keeps the fence while a replica's spool cannot flush, and attests once it has", func() {
		f := newFleet("", redisstore.CheckOptions{})
		for i := range 30 {
			Expect(status(f.replicas[i%3].front.URL, "sk-alice", i)).To(Equal(http.StatusOK))
		}
		f.replicas[2].sink.Down.Store(true)
		f.flush()
		for i := range 3 {
			Expect(status(f.replicas[i].front.URL, "sk-bob", i)).To(Equal(http.StatusServiceUnavailable))
		}
		Eventually(func() string { _, why := f.order(); return why }).WithTimeout(10*time.Second).
			Should(ContainSubstring("replica proxy-2 has flushed its ledger only through"), "the others flushed past the loss")
		Consistently(func() string { _, why := f.order(); return why }).WithTimeout(time.Second).
			Should(ContainSubstring("replica proxy-2 has flushed its ledger only through"))
		Expect(f.fenced()).To(Equal(3))
		Expect(f.attested(recovery.Attested)).To(BeZero())

		By("the database reachable again for replica 2")
		f.replicas[2].sink.Down.Store(false)
		var o *config.LedgerAttestation
		Eventually(func() string { var why string; o, why = f.order(); return why }).WithTimeout(10 * time.Second).Should(BeEmpty())
		f.apply(orderOf(o))
		Eventually(func() float64 { return f.attested(recovery.Attested) }).WithTimeout(10 * time.Second).Should(Equal(1.0))
		Expect(f.counters()["key-dollars/alice"]).To(BeNumerically("~", f.ledgerSums()["key-dollars/alice"], 1e-9))
	})

	It("keeps the fence while the ledger is unreachable at the loss, even given an order", func() {
		f := newFleet("", redisstore.CheckOptions{})
		for i := range 30 {
			Expect(status(f.replicas[i%3].front.URL, "sk-alice", i)).To(Equal(http.StatusOK))
		}
		f.settle()
		for _, r := range f.replicas {
			r.sink.Down.Store(true)
		}
		for i := range 3 {
			Expect(status(f.replicas[i].front.URL, "sk-alice", i)).To(Equal(http.StatusOK)) // spooled, not in the ledger
		}
		f.flush()
		for i := range 3 {
			Expect(status(f.replicas[i].front.URL, "sk-bob", i)).To(Equal(http.StatusServiceUnavailable))
		}
		time.Sleep(3 * grace) // past the grace, with nothing flushed
		_, why := f.order()
		Expect(why).To(ContainSubstring("has flushed its ledger only through"))

		By("an order given anyway (a stale one): the sums cannot be read, the fence stays")
		Expect(pg.Stop("fast")).To(Succeed())
		DeferCleanup(func() { _ = pg.Start() })
		f.apply(orderOf(&config.LedgerAttestation{Epoch: epochOf(f.replicas[0]), FlushedThroughMillis: time.Now().UnixMilli()}))
		Eventually(func() float64 { return f.attested(recovery.LedgerFailed) }).WithTimeout(10 * time.Second).Should(BeNumerically(">=", 1))
		Expect(f.attested(recovery.Attested)).To(BeZero())
		Expect(f.fenced()).To(Equal(3))
		Expect(status(f.replicas[0].front.URL, "sk-bob", 99)).To(Equal(http.StatusServiceUnavailable))
	})

	It("never attests a store check's fence", func() {
		f := newFleet("", redisstore.CheckOptions{Mode: redisstore.CheckEnforce, Interval: -1})
		c := redis.NewClient(&redis.Options{Addr: f.rs.Addr()})
		defer c.Close()
		Expect(c.ConfigSet(f.ctx, "maxmemory-policy", "allkeys-lru").Err()).To(Succeed())
		for _, r := range f.replicas {
			r.store.CheckStore(f.ctx)
		}
		Expect(status(f.replicas[0].front.URL, "sk-alice", 1)).To(Equal(http.StatusServiceUnavailable))
		Expect(f.replicas[0].store.Epochs()[0].StoreFence).NotTo(BeEmpty())
		_, why := f.order()
		Expect(why).To(ContainSubstring("fenced by a store check"))
		out, err := f.replicas[0].attester.Attempt(f.ctx, &config.LedgerAttestation{Epoch: epochOf(f.replicas[0]), FlushedThroughMillis: time.Now().UnixMilli()})
		Expect(out).To(Equal(recovery.StoreCheck))
		Expect(err).To(MatchError(ContainSubstring("store check")))
		Expect(status(f.replicas[0].front.URL, "sk-alice", 2)).To(Equal(http.StatusServiceUnavailable))
	})

	It("leaves the fence to an administrator when a durable rule counts by what the ledger does not record", func() {
		f := newFleet(`  - {name: client-dollars, dimension: client, amount: cost, windows: [{limit: 10, calendar: {every: month}}]}`, redisstore.CheckOptions{})
		Expect(status(f.replicas[0].front.URL, "sk-alice", 1)).To(Equal(http.StatusOK))
		lost := epochOf(f.replicas[0])
		f.flush()
		Expect(status(f.replicas[0].front.URL, "sk-alice", 2)).To(Equal(http.StatusServiceUnavailable))
		out, err := f.replicas[0].attester.Attempt(f.ctx, &config.LedgerAttestation{Epoch: lost, FlushedThroughMillis: time.Now().UnixMilli()})
		Expect(out).To(Equal(recovery.Unanswerable))
		Expect(err).To(MatchError(ContainSubstring(`rule "client-dollars" counts by client`)))
		Expect(status(f.replicas[0].front.URL, "sk-alice", 3)).To(Equal(http.StatusServiceUnavailable))
	})
})
