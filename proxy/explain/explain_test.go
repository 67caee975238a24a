// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package explain_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/proxy/budget/storetest"
	"github.com/tokenwarden/tokenwarden/proxy/config"
	"github.com/tokenwarden/tokenwarden/proxy/explain"
)

// server is the handler on a real limiter and policy: one key, alice, whose team
// has a rule of its own.
func server(t *testing.T, loaded bool) *httptest.Server {
	t.Helper()
	c, err := config.Parse([]byte(fmt.Sprintf(`
upstreams: [{name: default, url: "http://127.0.0.1:1"}]
api_keys: [{name: alice, team: research, key_sha256: "%064x"}]
rate_limiting:
  budget_division: {replicas: 3}
  limits: {per_api_key: {requests_per_second: 5, tokens_per_minute: 30000}, per_team: {tokens_per_minute: 9000}}
  rules: [{name: llm/research, dimension: team, subjects: [research], windows: [{limit: 60000, rolling: {period: minute}}]}]
`, 1)))
	if err != nil {
		t.Fatal(err)
	}
	p := budget.NewPolicy(c)
	clock := storetest.NewClock()
	l := budget.NewLimiter(budget.NewMemory(clock, 100), budget.NopRecorder{}, clock, false)
	charged := map[string]bool{"/v1/chat/completions": true}
	srv := httptest.NewServer(explain.Handler(func(ctx context.Context, q explain.Query) (explain.Answer, error) {
		if !loaded {
			return explain.Answer{}, explain.ErrNoConfig
		}
		k := p.Key(q.APIKey)
		if k == nil {
			return explain.Answer{}, explain.ErrUnknownKey
		}
		return explain.Answer{Generation: 4, Route: q.Route, Explanation: l.Explain(ctx, p, budget.Identity{Key: k, Model: q.Model}, charged[q.Route])}, nil
	}))
	t.Cleanup(srv.Close)
	return srv
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(body)
}

// The answer is the resolver's, in reservation order, on the default route.
func TestExplain(t *testing.T) {
	srv := server(t, true)
	code, body := get(t, srv.URL+"/admin/explain?api_key=alice&model=demo")
	if code != http.StatusOK {
		t.Fatalf("GET: %d %s", code, body)
	}
	var a explain.Answer
	if err := json.Unmarshal([]byte(body), &a); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, b := range a.Budgets {
		got = append(got, fmt.Sprintf("%s %g/%g", b.Name(), b.ReplicaLimit, b.Limit))
	}
	want := []string{"limits api_key second 5/5", "limits api_key minute 10000/30000", "rule llm/research minute 20000/60000"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("budgets %q, want %q", got, want)
	}
	if a.Route != explain.DefaultRoute || a.Generation != 4 || a.APIKey != "alice" || a.Model != "demo" || !a.Charged {
		t.Errorf("answer %+v", a)
	}
	if len(a.Replaced) != 1 || a.Replaced[0].What != "limits team minute" {
		t.Errorf("replaced %+v, want the team's limit", a.Replaced)
	}
	if a.Levels != "memory" || a.Budgets[1].Remaining == nil || *a.Budgets[1].Remaining != 10000 {
		t.Errorf("levels %q, budgets %+v: want each level read from memory, whole", a.Levels, a.Budgets)
	}
	// A route that is not charged: only the request count.
	_, body = get(t, srv.URL+"/admin/explain?api_key=alice&route=/v1/models")
	if err := json.Unmarshal([]byte(body), &a); err != nil || len(a.Budgets) != 1 || a.Charged {
		t.Errorf("an uncharged route: %v %s", err, body)
	}
}

// A bad query, an unknown key and a proxy without config each get their status and
// one line.
func TestExplainErrors(t *testing.T) {
	srv := server(t, true)
	for _, c := range []struct {
		url  string
		code int
		body string
	}{
		{srv.URL + "/admin/explain", http.StatusBadRequest, "api_key is required"},
		{srv.URL + "/admin/explain?api_key=mallory", http.StatusNotFound, "no API key named mallory in the config in force"},
		{server(t, false).URL + "/admin/explain?api_key=alice", http.StatusServiceUnavailable, "no configuration loaded yet"},
	} {
		code, body := get(t, c.url)
		if code != c.code || !strings.HasPrefix(body, c.body) || strings.Count(body, "\n") != 1 {
			t.Errorf("GET %s: %d %q, want %d %q", c.url, code, body, c.code, c.body)
		}
	}
}
