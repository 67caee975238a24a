// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package chart

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/proxy/budget/redisstore"
	"github.com/tokenwarden/tokenwarden/proxy/metrics"
	"github.com/tokenwarden/tokenwarden/proxy/server"
	"github.com/tokenwarden/tokenwarden/test/fakellm"
	"github.com/tokenwarden/tokenwarden/test/redisserver"
)

// durableFamilies are what the durable budgets' alerts read.
var durableFamilies = []string{"tokenwarden_durable_fenced_total", "tokenwarden_redis_store_check"}

// durableExported is the metric families of a proxy whose durable counters are
// fenced: it runs under an epoch its real Redis does not hold, with the store checks
// on, and its dollar budget's request is answered 503 budget_recovering.
func durableExported(t *testing.T) map[string]bool {
	t.Helper()
	rs := redisserver.Start(t)
	backend := httptest.NewServer(fakellm.New())
	defer backend.Close()
	reg := prometheus.NewRegistry()
	m := metrics.New(reg)
	mem := budget.NewMemory(budget.SystemClock{}, 100)
	store, err := redisstore.New(redisstore.Options{URL: rs.URL(), Fallback: mem, Recorder: m, Epoch: "1796025600123-9f3c0a6e5b1d2c47",
		Checks: redisstore.CheckOptions{Mode: redisstore.CheckReport}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = store.Close() }()
	srv := server.New(server.Options{Store: store, Memory: mem, Metrics: m, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	doc := `
upstreams: [{name: fake, url: "` + backend.URL + `"}]
models: [{name: m, price: {input: 2.5, output: 10}}]
api_keys: [{name: alice, key_sha256: "` + sha256Hex("sk-alice") + `"}]
rate_limiting:
  storage: redis
  redis: {url: "` + rs.URL() + `", epoch: "1796025600123-9f3c0a6e5b1d2c47"}
  budget_division: {replicas: 1}
  rules:
  - {name: alice-dollars, dimension: api_key, amount: cost, windows: [{limit: 25, calendar: {every: month}}]}
`
	if _, err := srv.Apply([]byte(doc), "test"); err != nil {
		t.Fatal(err)
	}
	front := httptest.NewServer(srv)
	defer front.Close()
	req, _ := http.NewRequest("POST", front.URL+"/v1/chat/completions", strings.NewReader(`{"model":"m","max_tokens":10}`))
	req.Header.Set("Authorization", "Bearer sk-alice")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(body), "budget_recovering") {
		t.Fatalf("a fenced dollar budget answered %d: %s", resp.StatusCode, body)
	}
	admin := httptest.NewServer(srv.AdminHandler(reg))
	defer admin.Close()
	return scrapeFor(t, admin.URL, durableFamilies)
}

// TestEveryAlertHasARunbookRow: each alert the chart installs has its row in the
// alert table of docs/runbooks.md, which says when it fires and what to do.
func TestEveryAlertHasARunbookRow(t *testing.T) {
	rules, err := os.ReadFile(filepath.Join(chartDir, "rules", "alerts.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	runbooks, err := os.ReadFile(filepath.Join(chartDir, "..", "..", "docs", "runbooks.md"))
	if err != nil {
		t.Fatal(err)
	}
	alerts := regexp.MustCompile(`(?m)^\s*- alert: (\S+)$`).FindAllStringSubmatch(string(rules), -1)
	if len(alerts) < 10 {
		t.Fatalf("found only %d alerts; the pattern is broken", len(alerts))
	}
	for _, a := range alerts {
		if !strings.Contains(string(runbooks), "| `"+a[1]+"` |") {
			t.Errorf("docs/runbooks.md has no row for the alert %s", a[1])
		}
	}
}
