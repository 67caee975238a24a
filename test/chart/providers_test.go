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
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/proxy/metrics"
	"github.com/tokenwarden/tokenwarden/proxy/server"
	"github.com/tokenwarden/tokenwarden/test/fakellm"
)

// providerFamilies are the model registry's families the dashboard charts; each shows
// only once the request that counts it was served.
var providerFamilies = []string{
	"tokenwarden_upstream_breaker_state",
	"tokenwarden_upstream_cooldown_seconds_total",
	"tokenwarden_failovers_total",
	"tokenwarden_model_unavailable_total",
	"tokenwarden_fallbacks_total",
	"tokenwarden_context_window_refusals_total",
}

// providersExported runs a proxy with a model registry and sends it one request per
// provider event: a failover from an upstream answering 500, a prompt over the
// context window, a fallback from a refusing model budget, and a 503 for a model whose
// only credential cools after a 429. It returns the families its /metrics lists.
func providersExported(t *testing.T) map[string]bool {
	t.Helper()
	flaky, good, limited := fakellm.New(), fakellm.New(), fakellm.New()
	flaky.Set(fakellm.Behaviour{InputTokens: 1, OutputTokens: 1, Statuses: []int{500}})
	limited.Set(fakellm.Behaviour{InputTokens: 1, OutputTokens: 1, Status: 429})
	urls := map[string]string{}
	for name, b := range map[string]*fakellm.Server{"FLAKY": flaky, "GOOD": good, "LIMITED": limited} {
		s := httptest.NewServer(b)
		defer s.Close()
		urls[name] = s.URL
	}
	reg := prometheus.NewRegistry()
	m := metrics.New(reg)
	mem := budget.NewMemory(budget.SystemClock{}, 100)
	srv := server.New(server.Options{Store: mem, Memory: mem, Metrics: m, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	doc := strings.NewReplacer("FLAKY", urls["FLAKY"], "GOOD", urls["GOOD"], "LIMITED", urls["LIMITED"]).Replace(`
upstreams:
- {name: flaky, url: FLAKY}
- {name: good, url: GOOD}
- {name: limited, url: LIMITED}
models:
- {name: m, context_window: 1000, upstreams: [{upstream: flaky}, {upstream: good}]}
- {name: small, upstreams: [{upstream: good}]}
- {name: cooled, upstreams: [{upstream: limited}]}
api_keys: [{name: alice, key_sha256: "` + sha256Hex("sk-alice") + `"}]
rate_limiting:
  budget_division: {replicas: 1}
  rules:
  - {name: m-tokens, dimension: model, subjects: [m], windows: [{limit: 300, rolling: {period: minute}}], fallback_model: small}
`)
	if _, err := srv.Apply([]byte(doc), "test"); err != nil {
		t.Fatal(err)
	}
	front := httptest.NewServer(srv)
	defer front.Close()
	for _, r := range []struct {
		model, ceiling string
		code           int
	}{
		{"m", "10", 200},      // flaky answers 500: failover to good
		{"m", "5000", 400},    // over the context window of 1000
		{"m", "500", 200},     // over m-tokens: served by small
		{"cooled", "10", 429}, // limited's credential starts cooling
		{"cooled", "10", 503}, // every upstream of cooled is out
	} {
		req, _ := http.NewRequest("POST", front.URL+"/v1/chat/completions", strings.NewReader(`{"model":"`+r.model+`","max_tokens":`+r.ceiling+`}`))
		req.Header.Set("Authorization", "Bearer sk-alice")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != r.code {
			t.Fatalf("%s with max_tokens %s: got %d, want %d: %s", r.model, r.ceiling, resp.StatusCode, r.code, body)
		}
	}
	admin := httptest.NewServer(srv.AdminHandler(reg))
	defer admin.Close()
	return scrapeFor(t, admin.URL, providerFamilies)
}

// scrapeFor is the families the /metrics of the admin server at url lists, once they
// include want (or after 30 s).
func scrapeFor(t *testing.T, url string, want []string) map[string]bool {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second) // generous: the loop ends as soon as every family shows
	for {
		resp, err := http.Get(url + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		exported := families(string(b))
		if allOf(exported, want) || time.Now().After(deadline) {
			return exported
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// families is the set of metric families a /metrics text lists, with a histogram's
// _bucket, _sum and _count series.
func families(scraped string) map[string]bool {
	exported := map[string]bool{}
	for _, line := range strings.Split(scraped, "\n") {
		if name, ok := strings.CutPrefix(line, "# TYPE "); ok {
			fields := strings.Fields(name)
			exported[fields[0]] = true
			if fields[1] == "histogram" {
				for _, s := range []string{"_bucket", "_sum", "_count"} {
					exported[fields[0]+s] = true
				}
			}
		}
	}
	return exported
}

func allOf(set map[string]bool, names []string) bool {
	for _, n := range names {
		if !set[n] {
			return false
		}
	}
	return true
}

// TestProviderPanels checks the dashboard charts each provider family: breaker state,
// cooldowns, failovers, 503s, fallbacks and context-window refusals.
func TestProviderPanels(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(chartDir, "dashboards", "tokenwarden.json"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range providerFamilies {
		if !strings.Contains(string(data), f) {
			t.Errorf("the dashboard has no panel on %s", f)
		}
	}
}
