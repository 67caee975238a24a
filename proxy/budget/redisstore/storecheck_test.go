// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package redisstore_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/proxy/budget/redisstore"
	"github.com/tokenwarden/tokenwarden/proxy/metrics"
	"github.com/tokenwarden/tokenwarden/test/redisserver"
)

// checkerCommands are what docs/redis.md gives the check credential.
var checkerCommands = []string{"+config|get", "+acl|dryrun", "+info", "+cluster|slots"}

// checkRules are a rolling token rule and a durable cost rule of alice's.
const checkRules = `
  - {name: minute, dimension: api_key, windows: [{limit: 100000, rolling: {period: minute}}]}
  - {name: monthly, dimension: api_key, subjects: [alice], amount: cost, windows: [{limit: 1, calendar: {every: month}}]}
`

// checked is a store that runs the store checks only when CheckStore asks, with its
// limiter, metrics and log.
type checked struct {
	s    *redisstore.Store
	l    *budget.Limiter
	m    *metrics.Metrics
	logs *syncBuffer
	p    *budget.Policy
}

// syncBuffer is a log written by the checking goroutine while a test reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// openChecked opens a store on url with the checks in mode, as the check credential
// user (none when empty), and runs the first check.
func openChecked(url, mode, checkUser string) *checked {
	GinkgoHelper()
	c := &checked{m: metrics.New(prometheus.NewRegistry()), logs: &syncBuffer{}, p: redisPolicy(checkRules)}
	opts := redisstore.CheckOptions{Mode: mode, Interval: -1}
	if checkUser != "" {
		opts.Username, opts.Password = checkUser, "pw"
	}
	s, err := redisstore.New(redisstore.Options{URL: url, Checks: opts, Recorder: c.m,
		DialTimeout: time.Second, ReadTimeout: time.Second, WriteTimeout: time.Second,
		Logger: slog.New(slog.NewTextHandler(c.logs, nil))})
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(s.Close)
	c.s, c.l = s, budget.NewLimiter(s, c.m, budget.SystemClock{}, false)
	c.s.CheckStore(context.Background())
	return c
}

// result is check's result in the store's last checks, as /admin/durable reports it.
func (c *checked) result(check string) budget.CheckResult {
	GinkgoHelper()
	for _, r := range c.s.Epochs()[0].StoreChecks {
		if r.Check == check {
			return r
		}
	}
	Fail("no result for " + check)
	return budget.CheckResult{}
}

// gauge is tokenwarden_redis_store_check{check,result}.
func (c *checked) gauge(check, result string) float64 {
	return testutil.ToFloat64(c.m.StoreChecks.WithLabelValues(check, result))
}

// admit admits key on gpt-4o for 1,000 output tokens (a quarter dollar) and settles it.
func (c *checked) admit(key string) error {
	dec, err := c.l.Admit(context.Background(), c.p, budget.Identity{Key: c.p.Key(key), Model: "gpt-4o"}, budget.Ask{Input: 1, Output: 1000})
	if err == nil && dec.Hold != nil {
		dec.Hold.Settle(budget.Used{Input: 1, Output: 1000})
	}
	return err
}

// storeFenced is the store-check reason of a durable admission's refusal, "" when it
// was admitted; any other error fails.
func storeFenced(err error) string {
	GinkgoHelper()
	if err == nil {
		return ""
	}
	var rec *budget.RecoveringError
	Expect(errors.As(err, &rec)).To(BeTrue(), "%v", err)
	Expect(rec.StoreCheck).NotTo(BeEmpty(), "a store-check fence, not a lost epoch")
	return rec.StoreCheck
}

// do runs a command on node n and fails on an error.
func do(n *redisserver.Server, args ...any) {
	GinkgoHelper()
	Expect(n.Client().Do(context.Background(), args...).Err()).To(Succeed())
}

// setUser creates user on every node with password pw and commands, on every key.
func setUser(nodes []*redisserver.Server, user string, commands []string) {
	restrictUser(nodes, user, "~*", commands)
}

// fleetURL is url with user:pw@ after the scheme.
func fleetURL(url, user string) string {
	scheme, rest, _ := strings.Cut(url, "://")
	return scheme + "://" + user + ":pw@" + rest
}

var _ = Describe("Store checks", func() {
	Describe("on one server", func() {
		var srv *redisserver.Server
		BeforeEach(func() {
			srv = redisserver.Start(GinkgoT())
			setUser([]*redisserver.Server{srv}, "checker", checkerCommands)
		})

		DescribeTable("a check fails or passes as the server is configured, and only enforce fences the durable rules",
			func(check string, setup func(), mode, want string) {
				setup()
				fleet := "fleet"
				c := openChecked(fleetURL(srv.URL(), fleet), mode, "checker")
				r := c.result(check)
				Expect(r.Result).To(Equal(want), r.Detail)
				Expect(c.gauge(check, want)).To(Equal(1.0))
				Expect(c.admit("bob")).To(Succeed(), "a rolling token rule is never fenced by a store check")
				fence := storeFenced(c.admit("alice"))
				if mode == redisstore.CheckEnforce && want == redisstore.CheckFail {
					Expect(fence).To(HavePrefix(check+": "), "the refusal names the failed check")
					Expect(c.s.Epochs()[0].StoreFence).To(Equal(fence))
					Expect(c.s.Epochs()[0].Fenced).To(BeFalse(), "a store-check fence is told apart from a lost epoch")
				} else {
					Expect(fence).To(BeEmpty(), "report mode, or a passing check, fences nothing")
				}
				if want != redisstore.CheckPass {
					Expect(c.logs.String()).To(ContainSubstring("check=" + check))
				}
			},
			func(check string, _ func(), mode, want string) string {
				return fmt.Sprintf("%s %s in %s mode", check, want, mode)
			},
			Entry(nil, redisstore.CheckMaxmemoryPolicy, func() { fleetUser(srv, "") }, redisstore.CheckReport, redisstore.CheckPass),
			Entry(nil, redisstore.CheckMaxmemoryPolicy, func() { fleetUser(srv, ""); lru(srv) }, redisstore.CheckReport, redisstore.CheckFail),
			Entry(nil, redisstore.CheckMaxmemoryPolicy, func() { fleetUser(srv, "") }, redisstore.CheckEnforce, redisstore.CheckPass),
			Entry(nil, redisstore.CheckMaxmemoryPolicy, func() { fleetUser(srv, ""); lru(srv) }, redisstore.CheckEnforce, redisstore.CheckFail),
			Entry(nil, redisstore.CheckDestructiveCommands, func() { fleetUser(srv, "") }, redisstore.CheckReport, redisstore.CheckPass),
			Entry(nil, redisstore.CheckDestructiveCommands, func() { fleetUser(srv, "+flushall") }, redisstore.CheckReport, redisstore.CheckFail),
			Entry(nil, redisstore.CheckDestructiveCommands, func() { fleetUser(srv, "") }, redisstore.CheckEnforce, redisstore.CheckPass),
			Entry(nil, redisstore.CheckDestructiveCommands, func() { fleetUser(srv, "+flushall") }, redisstore.CheckEnforce, redisstore.CheckFail),
			Entry(nil, redisstore.CheckDestructiveCommands, func() { fleetUser(srv, "+del") }, redisstore.CheckEnforce, redisstore.CheckFail),
			Entry(nil, redisstore.CheckDestructiveCommands, func() { fleetUser(srv, "+restore") }, redisstore.CheckEnforce, redisstore.CheckFail),
			Entry(nil, redisstore.CheckEvictions, func() { fleetUser(srv, "") }, redisstore.CheckEnforce, redisstore.CheckPass),
		)

		It("names each destructive command the fleet's user may run", func() {
			fleetUser(srv, "+flushall", "+flushdb", "+restore", "+debug", "+del")
			c := openChecked(fleetURL(srv.URL(), "fleet"), redisstore.CheckReport, "checker")
			Expect(c.result(redisstore.CheckDestructiveCommands).Detail).To(HaveSuffix("user fleet may run FLUSHALL, FLUSHDB, RESTORE, DEBUG, DEL"))
		})

		It("skips, and never fails, what the least-privilege user may not check, in enforce mode too", func() {
			fleetUser(srv, "")
			lru(srv)
			c := openChecked(fleetURL(srv.URL(), "fleet"), redisstore.CheckEnforce, "")
			for _, check := range []string{redisstore.CheckMaxmemoryPolicy, redisstore.CheckDestructiveCommands, redisstore.CheckEvictions} {
				r := c.result(check)
				Expect(r.Result).To(Equal(redisstore.CheckSkipped), check)
				Expect(r.Detail).To(ContainSubstring("no permission to check"))
				Expect(c.gauge(check, redisstore.CheckSkipped)).To(Equal(1.0))
			}
			Expect(storeFenced(c.admit("alice"))).To(BeEmpty())
			Expect(c.logs.String()).To(ContainSubstring("Redis store check skipped"))
		})

		It("lifts an enforced fence when the check passes again", func() {
			fleetUser(srv, "")
			lru(srv)
			c := openChecked(fleetURL(srv.URL(), "fleet"), redisstore.CheckEnforce, "checker")
			Expect(storeFenced(c.admit("alice"))).To(HavePrefix("maxmemory_policy: "))
			do(srv, "CONFIG", "SET", "maxmemory-policy", "noeviction")
			c.s.CheckStore(context.Background())
			Expect(storeFenced(c.admit("alice"))).To(BeEmpty())
			Expect(c.s.Epochs()[0].StoreFence).To(BeEmpty())
			Expect(c.gauge(redisstore.CheckMaxmemoryPolicy, redisstore.CheckFail)).To(BeZero())
			Expect(c.logs.String()).To(ContainSubstring("no longer fenced"))
		})

		It("puts changed settings in force at once, as a reload does: the mode, the check credential, and none", func() {
			fleetUser(srv, "")
			lru(srv)
			// The least-privilege fleet user, reporting: its checks are skipped.
			c := openChecked(fleetURL(srv.URL(), "fleet"), redisstore.CheckReport, "")
			Expect(c.result(redisstore.CheckMaxmemoryPolicy).Result).To(Equal(redisstore.CheckSkipped))
			Expect(storeFenced(c.admit("alice"))).To(BeEmpty())

			// A check credential and enforce mode, checking every hour: the first round
			// runs now, on the new connection.
			enforce := redisstore.CheckOptions{Mode: redisstore.CheckEnforce, Interval: time.Hour, Username: "checker", Password: "pw"}
			Expect(c.s.SetChecks(enforce)).To(Succeed())
			Eventually(func() string { return c.result(redisstore.CheckMaxmemoryPolicy).Result }).Should(Equal(redisstore.CheckFail))
			Expect(storeFenced(c.admit("alice"))).To(HavePrefix("maxmemory_policy: "))
			Expect(c.logs.String()).To(ContainSubstring("Redis store checks reconfigured"))
			Expect(c.s.SetChecks(enforce)).To(Succeed(), "the same settings change nothing")

			// Back to report mode: the failed check no longer fences.
			report := enforce
			report.Mode = redisstore.CheckReport
			Expect(c.s.SetChecks(report)).To(Succeed())
			Eventually(func() string { return storeFenced(c.admit("alice")) }).Should(BeEmpty())
			Expect(c.result(redisstore.CheckMaxmemoryPolicy).Result).To(Equal(redisstore.CheckFail), "still reported")

			// No checks: nothing reported, nothing fenced.
			Expect(c.s.SetChecks(redisstore.CheckOptions{Mode: redisstore.CheckEnforce, Interval: time.Hour, Username: "checker", Password: "pw"})).To(Succeed())
			Eventually(func() string { return storeFenced(c.admit("alice")) }).ShouldNot(BeEmpty())
			Expect(c.s.SetChecks(redisstore.CheckOptions{})).To(Succeed())
			Expect(storeFenced(c.admit("alice"))).To(BeEmpty())
			Expect(c.s.Epochs()[0].StoreChecks).To(BeEmpty())
			Expect(c.s.SetChecks(redisstore.CheckOptions{Mode: "strict"})).To(MatchError(ContainSubstring("rate_limiting.redis.checks.mode")))
		})

		It("fences the durable rules when counters are evicted, in report mode too, until the balances are attested", func() {
			ctx := context.Background()
			c := openChecked(srv.URL(), redisstore.CheckReport, "checker")
			Expect(c.admit("alice")).To(Succeed())
			Expect(c.result(redisstore.CheckEvictions).Result).To(Equal(redisstore.CheckPass))
			// A tiny maxmemory under allkeys-lru: writing evicts keys.
			used, err := srv.Client().Info(ctx, "memory").Result()
			Expect(err).NotTo(HaveOccurred())
			var mem int64
			for _, line := range strings.Split(used, "\n") {
				if v, ok := strings.CutPrefix(strings.TrimSpace(line), "used_memory:"); ok {
					_, _ = fmt.Sscan(v, &mem)
				}
			}
			do(srv, "CONFIG", "SET", "maxmemory", fmt.Sprint(mem+256<<10))
			lru(srv)
			for i := range 200 {
				do(srv, "SET", fmt.Sprintf("junk:%d", i), strings.Repeat("x", 8<<10))
			}
			c.s.CheckStore(ctx)
			Expect(c.result(redisstore.CheckEvictions).Result).To(Equal(redisstore.CheckFail))
			Expect(storeFenced(c.admit("alice"))).To(HavePrefix("evictions: "))
			Expect(c.admit("bob")).To(Succeed())
			Expect(c.s.Epochs()[0].StoreFence).To(HavePrefix("evictions: "))
			Expect(c.logs.String()).To(ContainSubstring("Redis evicted keys"))

			// No key evicted since: the check passes, and the counters stay fenced.
			do(srv, "CONFIG", "SET", "maxmemory", "0")
			c.s.CheckStore(ctx)
			Expect(c.result(redisstore.CheckEvictions).Result).To(Equal(redisstore.CheckPass))
			Expect(storeFenced(c.admit("alice"))).To(HavePrefix("evictions: "))

			_, err = c.s.Attest(ctx, nil)
			Expect(err).NotTo(HaveOccurred())
			Expect(storeFenced(c.admit("alice"))).To(BeEmpty())
			Expect(c.s.Epochs()[0].StoreFence).To(BeEmpty())
		})
	})

	Describe("on a three-master cluster", func() {
		var cl *redisserver.Cluster
		BeforeEach(func() {
			cl = redisserver.StartCluster(GinkgoT(), 3, 0)
			setUser(cl.Masters, "checker", checkerCommands)
			restrictUser(cl.Masters, "fleet", "~{tokenwarden:*", append(append([]string{}, userCommands...), clusterCommands...))
		})

		DescribeTable("every master is checked",
			func(setup func(), mode, want string) {
				setup()
				c := openChecked(fleetURL(cl.URL(), "fleet"), mode, "checker")
				r := c.result(redisstore.CheckClusterFullCoverage)
				Expect(r.Result).To(Equal(want), r.Detail)
				fence := storeFenced(c.admit("alice"))
				if mode == redisstore.CheckEnforce && want == redisstore.CheckFail {
					Expect(fence).To(ContainSubstring(cl.Masters[2].Addr()), "the master at fault is named")
				} else {
					Expect(fence).To(BeEmpty())
				}
				Expect(c.admit("bob")).To(Succeed())
			},
			Entry("full coverage required on one master: fails in report mode", func() { coverage(cl, "no", "no", "yes") }, redisstore.CheckReport, redisstore.CheckFail),
			Entry("full coverage required on one master: fails and fences in enforce mode", func() { coverage(cl, "no", "no", "yes") }, redisstore.CheckEnforce, redisstore.CheckFail),
			Entry("full coverage not required: passes in enforce mode", func() { coverage(cl, "no", "no", "no") }, redisstore.CheckEnforce, redisstore.CheckPass),
		)

		It("checks maxmemory-policy and the fleet user on every master", func() {
			coverage(cl, "no", "no", "no")
			do(cl.Masters[1], "CONFIG", "SET", "maxmemory-policy", "allkeys-lru")
			do(cl.Masters[0], "ACL", "SETUSER", "fleet", "+flushdb")
			c := openChecked(fleetURL(cl.URL(), "fleet"), redisstore.CheckEnforce, "checker")
			policy := c.result(redisstore.CheckMaxmemoryPolicy)
			Expect(policy.Result).To(Equal(redisstore.CheckFail))
			Expect(policy.Detail).To(Equal(cl.Masters[1].Addr() + ": maxmemory-policy is allkeys-lru, want noeviction"))
			user := c.result(redisstore.CheckDestructiveCommands)
			Expect(user.Result).To(Equal(redisstore.CheckFail))
			Expect(user.Detail).To(Equal(cl.Masters[0].Addr() + ": user fleet may run FLUSHDB"))
			Expect(storeFenced(c.admit("alice"))).To(ContainSubstring("maxmemory_policy"))
		})
	})

	DescribeTable("through Sentinel, the primary the sentinels name is checked",
		func(policy, mode, want string) {
			st := redisserver.StartSentinel(GinkgoT(), 1, 1)
			setUser(st.Data, "checker", checkerCommands)
			setUser(st.Data, "fleet", userCommands)
			do(st.Primary(GinkgoT()), "CONFIG", "SET", "maxmemory-policy", policy)
			c := openChecked(fleetURL(st.URL(), "fleet"), mode, "checker")
			r := c.result(redisstore.CheckMaxmemoryPolicy)
			Expect(r.Result).To(Equal(want))
			Expect(c.result(redisstore.CheckDestructiveCommands).Result).To(Equal(redisstore.CheckPass))
			fence := storeFenced(c.admit("alice"))
			if want == redisstore.CheckFail {
				Expect(r.Detail).To(Equal("the primary of tokenwarden: maxmemory-policy is allkeys-lru, want noeviction"))
			}
			if want == redisstore.CheckFail && mode == redisstore.CheckEnforce {
				Expect(fence).To(HavePrefix("maxmemory_policy: "))
			} else {
				Expect(fence).To(BeEmpty())
			}
			Expect(c.admit("bob")).To(Succeed())
		},
		Entry("allkeys-lru, enforce: fenced", "allkeys-lru", redisstore.CheckEnforce, redisstore.CheckFail),
		Entry("allkeys-lru, report: reported", "allkeys-lru", redisstore.CheckReport, redisstore.CheckFail),
		Entry("noeviction, enforce: passes", "noeviction", redisstore.CheckEnforce, redisstore.CheckPass),
	)
})

// fleetUser creates the fleet's user of docs/redis.md on srv, with extra commands.
func fleetUser(srv *redisserver.Server, extra ...string) {
	cmds := append([]string{}, userCommands...)
	for _, e := range extra {
		if e != "" {
			cmds = append(cmds, e)
		}
	}
	restrictUser([]*redisserver.Server{srv}, "fleet", "~{tokenwarden}:*", cmds)
}

// lru sets maxmemory-policy allkeys-lru on n.
func lru(n *redisserver.Server) { do(n, "CONFIG", "SET", "maxmemory-policy", "allkeys-lru") }

// coverage sets each master's cluster-require-full-coverage.
func coverage(cl *redisserver.Cluster, v ...string) {
	for i, m := range cl.Masters {
		do(m, "CONFIG", "SET", "cluster-require-full-coverage", v[i])
	}
}
