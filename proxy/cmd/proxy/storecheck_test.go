// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"log/slog"
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
