// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/proxy/config"
	"github.com/tokenwarden/tokenwarden/proxy/metrics"
	"github.com/tokenwarden/tokenwarden/test/redisserver"
)

// TestStoreChecksRunAtStart: a proxy on Redis checks the store at start by default
// (report mode), and a check credential whose password variable is unset refuses to
// start.
func TestStoreChecksRunAtStart(t *testing.T) {
	srv := redisserver.Start(t)
	if err := srv.Client().Do(context.Background(), "CONFIG", "SET", "maxmemory-policy", "allkeys-lru").Err(); err != nil {
		t.Fatal(err)
	}
	parse := func(checks string) *config.Config {
		c, err := config.Parse([]byte("upstreams: [{name: a, url: 'http://127.0.0.1:1'}]\n" +
			"rate_limiting: {storage: redis, redis: {url: '" + srv.URL() + "'" + checks + "}}\n"))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	m := metrics.New(prometheus.NewRegistry())
	store, _, err := newStore(parse(""), budget.SystemClock{}, m, slog.Default(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = store.Close() }()
	failed := m.StoreChecks.WithLabelValues("maxmemory_policy", "fail")
	for deadline := time.Now().Add(5 * time.Second); testutil.ToFloat64(failed) != 1; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("tokenwarden_redis_store_check{check=maxmemory_policy,result=fail} never became 1 on an allkeys-lru server")
		}
	}

	_, _, err = newStore(parse(", checks: {username: checker, password_env: TOKENWARDEN_TEST_UNSET_CHECK_PASSWORD}"),
		budget.SystemClock{}, m, slog.Default(), nil)
	if err == nil || !strings.Contains(err.Error(), "rate_limiting.redis.checks.password_env") {
		t.Fatalf("err %v, want one naming rate_limiting.redis.checks.password_env", err)
	}
}

// TestStoreChecksFollowAReload: a reloaded document's store checks apply without a
// restart. A proxy reporting a failed check fences the calendar and cost rules once
// its document says enforce, and lifts the fence when it says report again.
func TestStoreChecksFollowAReload(t *testing.T) {
	srv := redisserver.Start(t)
	if err := srv.Client().Do(context.Background(), "CONFIG", "SET", "maxmemory-policy", "allkeys-lru").Err(); err != nil {
		t.Fatal(err)
	}
	doc := func(mode string) string {
		return "upstreams: [{name: a, url: 'http://127.0.0.1:1'}]\n" +
			"rate_limiting: {storage: redis, redis: {url: '" + srv.URL() + "', checks: {mode: " + mode + ", interval_seconds: 3600}}}\n"
	}
	p := startProxy(t, doc("report"))
	durable := func() (fence string, checks []budget.CheckResult) {
		resp, err := http.Get("http://" + p.admin + "/admin/durable")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var body struct{ Groups []budget.GroupEpoch }
		if err := json.NewDecoder(resp.Body).Decode(&body); err != nil || len(body.Groups) != 1 {
			t.Fatalf("GET /admin/durable: %v, %d groups", err, len(body.Groups))
		}
		return body.Groups[0].StoreFence, body.Groups[0].StoreChecks
	}
	waitFor(t, "the first checks", func() bool { _, checks := durable(); return len(checks) > 0 })
	if fence, _ := durable(); fence != "" {
		t.Fatalf("report mode fenced: %s", fence)
	}
	reload := func(mode string) {
		if err := os.WriteFile(p.path, []byte(doc(mode)), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	reload("enforce")
	waitFor(t, "enforce mode to fence on the failed check", func() bool {
		fence, _ := durable()
		return strings.HasPrefix(fence, "maxmemory_policy: ")
	})
	reload("report")
	waitFor(t, "report mode to lift the fence", func() bool { fence, _ := durable(); return fence == "" })
	if strings.Contains(p.log.String(), "restart_required") && strings.Contains(p.log.String(), "rate_limiting.redis.checks") {
		t.Errorf("the checks were reported as waiting for a restart:\n%s", p.log.String())
	}
}
