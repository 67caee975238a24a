// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/tokenwarden/tokenwarden/test/fakellm"
	"github.com/tokenwarden/tokenwarden/test/pgserver"
	"github.com/tokenwarden/tokenwarden/test/redisserver"
	"github.com/tokenwarden/tokenwarden/test/stack"
)

// redisFleetManifest is a second fleet, on Redis, whose model has a price: a dollar
// budget of $25 a calendar month per key and a token budget of 10 million a calendar
// day per key, both resetting at midnight Berlin time. %[1]s is the fake backend, %[2]s
// the Redis server, %[3]s the fleet's ledger (ledgerSpec, or nothing).
const redisFleetManifest = `
apiVersion: tokenwarden.io/v1alpha1
kind: TokenProxy
metadata: {name: fleet-redis}
spec:
  replicas: 2
  upstreams: [{name: local, url: %[1]q}]
  storage: {type: Redis, redis: {url: %[2]q}}
  models:                                  # US dollars per million tokens
  - {name: demo, price: {input: "2.50", output: "10"}}
%[3]s---
apiVersion: v1
kind: Secret
metadata: {name: carol-key, labels: {tokenwarden.io/secret: api-key}}
stringData: {key: sk-demo-carol}
---
apiVersion: tokenwarden.io/v1alpha1
kind: ApiKey
metadata: {name: carol}
spec: {proxyRef: {name: fleet-redis}, secretRef: {name: carol-key}, user: carol, team: research}
---
apiVersion: tokenwarden.io/v1alpha1
kind: TokenBudget
metadata: {name: key-dollars}
spec:
  proxyRef: {name: fleet-redis}
  dimension: PerAPIKey
  amount: Cost
  windows: [{limit: "25", calendar: {every: Month, timeZone: Europe/Berlin}}]
---
apiVersion: tokenwarden.io/v1alpha1
kind: TokenBudget
metadata: {name: key-day-tokens}
spec:
  proxyRef: {name: fleet-redis}
  dimension: PerAPIKey
  windows: [{limit: 10M, calendar: {every: Day, timeZone: Europe/Berlin}}]
`

// ledgerSpec gives the Redis fleet its spend ledger: the database's URL in a Secret
// (%[1]q), rollups flushed every second so that the report shows them soon.
const ledgerSpec = `  ledger: {urlSecretRef: {name: ledger-db, key: url}, flushIntervalSeconds: 1}
---
apiVersion: v1
kind: Secret
metadata: {name: ledger-db, labels: {tokenwarden.io/secret: credential}}
stringData: {url: %[1]q}
`

// redisFleet tells step 5: a fleet whose dollar and calendar budgets are fleet totals
// in Redis. Without redis-server it says so and skips the step, unless need is set. It
// leaves the fleet's proxies in *proxies. With a ledger database (ledgerURL), the
// fleet records its spend there.
func redisFleet(ctx context.Context, s *stack.Stack, st *story, need bool, ledgerURL string, proxies *[]*stack.Proxy) error {
	st.step(5, "A Redis-backed fleet: $25 a month and 10 million tokens a calendar day per key, fleet totals")
	rs, stopRedis, err := startRedis()
	if err != nil {
		say("%v", err)
		if need {
			st.check(false, "redis-server is installed (Debian's redis-server package)")
		} else {
			say("Skipped: this step needs redis-server (Debian's redis-server package).")
		}
		return nil
	}
	defer stopRedis()
	path := s.Kubeconfig + ".redis-fleet.yaml"
	ledger := ""
	if ledgerURL != "" {
		ledger = fmt.Sprintf(ledgerSpec, ledgerURL)
	}
	if err := os.WriteFile(path, []byte(fmt.Sprintf(redisFleetManifest, s.LLMURL, rs.URL(), ledger)), 0o600); err != nil {
		return err
	}
	out, err := s.Kubectl("apply", "-n", ns, "-f", path)
	if err != nil {
		return err
	}
	say("kubectl apply: TokenProxy fleet-redis (2 replicas, storage Redis at %s, model demo at $2.50/$10 per million tokens), key carol, and two budgets:", rs.Addr())
	if ledgerURL != "" {
		say("Its spend ledger is a PostgreSQL database, named by the Secret ledger-db: every settlement is recorded there.")
	}
	indent(out)
	applied := time.Now()
	if *proxies, err = s.SyncProxies(ctx, ns, "fleet-redis"); err != nil {
		return err
	}
	generation, err := s.WaitEnforced(ctx, ns, "fleet-redis", enforceTimeout)
	if err != nil {
		return err
	}
	say("Both proxies applied config generation %d (%.1fs after the apply).", generation, time.Since(applied).Seconds())
	if out, err = s.Kubectl("get", "tokenbudgets", "-n", ns, "key-dollars", "key-day-tokens"); err == nil {
		indent(out)
	}
	p0, p1 := (*proxies)[0].URL, (*proxies)[1].URL

	a, err := chat(p0, "sk-demo-carol", 1000)
	if err != nil {
		return err
	}
	say("carol → proxy 0: %d, x-tokenwarden-budget-cost-remaining: $%s of $%s, x-ratelimit-tokens-day-remaining: %s of %s",
		a.code, a.header.Get("X-Tokenwarden-Budget-Cost-Remaining"), a.header.Get("X-Tokenwarden-Budget-Cost-Limit"),
		a.header.Get("X-Ratelimit-Tokens-Day-Remaining"), a.header.Get("X-Ratelimit-Tokens-Day-Limit"))
	st.check(a.code == 200 && a.header.Get("X-Tokenwarden-Budget-Cost-Limit") == "25",
		"the answer carries the cost headers: $25 is the fleet's total, not divided by the replicas")
	st.check(a.header.Get("X-Ratelimit-Tokens-Day-Limit") == "10000000", "and the calendar day's tokens: 10,000,000 for the fleet")

	// A big job: 2M input tokens at $2.50 and 1.5M output tokens at $10 a million.
	s.LLM.Set(fakellm.Behaviour{InputTokens: 2_000_000, OutputTokens: 1_500_000})
	a, err = chat(p0, "sk-demo-carol", 1000)
	s.LLM.Set(fakellm.Behaviour{InputTokens: 1200, OutputTokens: 300})
	if err != nil {
		return err
	}
	say("carol's batch job → proxy 0: %d; the backend reports 2,000,000 input and 1,500,000 output tokens: $20.00", a.code)
	// The spend lands when the proxy settles the answer: ask until proxy 1 sees it.
	var left float64
	deadline := time.Now().Add(enforceTimeout)
	for {
		a, err = chat(p1, "sk-demo-carol", 1000)
		if err != nil {
			return err
		}
		left, _ = strconv.ParseFloat(a.header.Get("X-Tokenwarden-Budget-Cost-Remaining"), 64)
		if (a.code == 200 && left < 5) || time.Now().After(deadline) {
			break
		}
	}
	say("carol → proxy 1: %d, x-tokenwarden-budget-cost-remaining: $%s", a.code, a.header.Get("X-Tokenwarden-Budget-Cost-Remaining"))
	st.check(left > 4.9 && left < 5, "proxy 1 sees the $20 spent through proxy 0: the dollars are counted once, in Redis")

	// 600,000 output tokens at $10 a million reserve $6: more than the $5 left.
	refused, err := chat(p1, "sk-demo-carol", 600_000)
	if err != nil {
		return err
	}
	say("carol asks for up to 600,000 output tokens ($6.00 at most) → proxy 1: %d, Retry-After: %s s (the month's end in Berlin)",
		refused.code, refused.header.Get("Retry-After"))
	if m := errorMessage(refused); m != "" {
		say("body: %s", m)
	}
	st.check(refused.code == 429 && strings.Contains(errorMessage(refused), "demo/key-dollars"),
		"refused at the dollar with 429, the body naming her budget demo/key-dollars")
	wait, _ := strconv.Atoi(refused.header.Get("Retry-After"))
	st.check(wait > 0 && time.Duration(wait)*time.Second <= 32*24*time.Hour, "Retry-After is the time to the window's reset")
	a, err = chat(p0, "sk-demo-carol", 1000)
	if err != nil {
		return err
	}
	st.check(a.code == 200, "a request that fits the $5 left is still answered: $"+a.header.Get("X-Tokenwarden-Budget-Cost-Remaining")+" remain")
	if ledgerURL == "" {
		return nil
	}
	left, _ = strconv.ParseFloat(a.header.Get("X-Tokenwarden-Budget-Cost-Remaining"), 64)
	return restartStory(ctx, s, st, rs, p0, left)
}

// startRedis starts a redis-server for the demo; stop kills it.
func startRedis() (srv *redisserver.Server, stop func(), err error) {
	if _, err := redisserver.Binary(); err != nil {
		return nil, nil, err
	}
	t := &demoTB{}
	defer func() {
		if r := recover(); r != nil {
			t.stop()
			srv, stop, err = nil, nil, fmt.Errorf("%v", r)
		}
	}()
	return redisserver.Start(t), t.stop, nil
}

// startLedgerDB starts a PostgreSQL for the Redis fleet's spend ledger and returns a
// new database's URL; "" (and a stop that does nothing) without PostgreSQL's programs.
func startLedgerDB() (url string, stop func()) {
	t := &demoTB{}
	defer func() {
		if r := recover(); r != nil {
			t.stop()
			say("No spend ledger: %v", r)
			url, stop = "", func() {}
		}
	}()
	pg := pgserver.Start(t)
	return pg.NewDatabase(t), t.stop
}

// demoTB lets redisserver and pgserver run outside a test: a fatal error panics (startRedis
// recovers it), and the cleanups run at stop.
type demoTB struct{ cleanups []func() }

func (*demoTB) Helper()                   {}
func (t *demoTB) Cleanup(f func())        { t.cleanups = append(t.cleanups, f) }
func (*demoTB) Logf(string, ...any)       {}
func (*demoTB) Fatalf(f string, a ...any) { panic(fmt.Errorf(f, a...)) }
func (*demoTB) Skipf(f string, a ...any)  { panic(fmt.Errorf(f, a...)) }

func (t *demoTB) stop() {
	for i := len(t.cleanups) - 1; i >= 0; i-- {
		t.cleanups[i]()
	}
	t.cleanups = nil
}

// excerpt prints the lines of a proxy's /metrics that keep selects, and counts them.
func excerpt(adminURL string, keep func(string) bool) int {
	resp, err := http.Get(adminURL + "/metrics")
	if err != nil {
		say("%v", err)
		return 0
	}
	defer func() { _ = resp.Body.Close() }()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	shown := 0
	for sc.Scan() {
		if line := sc.Text(); keep(line) {
			indent(line)
			shown++
		}
	}
	return shown
}
