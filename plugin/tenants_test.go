// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package plugin_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/tokenwarden/tokenwarden/plugin"
	"github.com/tokenwarden/tokenwarden/test/fakellm"
)

// tenantConfig is a fleet in namespace tn-llm with a key of its own (ops) and one key of
// each of two tenants, tn-a and tn-b: every key may send one request an hour, by
// a budget of its level, under the platform's fleet-wide hour.
const tenantConfig = `
upstreams: [{name: local, url: %q}]
auth: {mode: required}
api_keys:
- {name: ops, user: ops, team: platform, key_sha256: %q}
- {name: tn-a_ann, user: tn-a/ann, team: tn-a/research, tenant: tn-a, key_sha256: %q}
- {name: tn-b_bob, user: tn-b/bob, team: tn-b/research, tenant: tn-b, key_sha256: %q}
ledger: {flush_interval_seconds: 1}
rate_limiting:
  storage: memory
  rules:
  - {name: llm/fleet-hour, dimension: global, amount: requests, windows: [{limit: 1000, rolling: {period: hour}}]}
  - {name: llm/ops, dimension: api_key, subjects: [ops], amount: requests, windows: [{limit: 1, rolling: {period: hour}}]}
  - {name: tn-a/cap, tenant: tn-a, dimension: global, amount: requests, windows: [{limit: 1, rolling: {period: hour}}]}
  - {name: tn-b/cap, tenant: tn-b, dimension: global, amount: requests, windows: [{limit: 1, rolling: {period: hour}}]}
`

// tenantReader is a ServiceAccount of ns that may get tokenbudgets there and nothing
// of the admin API's paths: a tenant's reader.
func tenantReader(t *testing.T, ns, name string) string {
	t.Helper()
	ctx := context.Background()
	must(t, k8s.Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{"tokenwarden.io"}, Resources: []string{"tokenbudgets"}, Verbs: []string{"get", "list"}}}}))
	must(t, k8s.Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: name},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: name}}}))
	return serviceAccount(t, ns, name, false)
}

// adminGet reads an admin path with the kubeconfig's bearer token: the status and the
// body.
func adminGet(t *testing.T, p proxyProc, kc, path string) (int, string) {
	t.Helper()
	c, err := clientcmd.LoadFromFile(kc)
	must(t, err)
	req, err := http.NewRequest(http.MethodGet, "http://"+p.admin+path, nil)
	must(t, err)
	req.Header.Set("Authorization", "Bearer "+c.AuthInfos[c.Contexts[c.CurrentContext].AuthInfo].Token)
	resp, err := http.DefaultClient.Do(req)
	must(t, err)
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	must(t, err)
	return resp.StatusCode, string(body)
}

// refusedKeys are the keys of an /admin/refusals answer.
func refusedKeys(t *testing.T, body string) []string {
	t.Helper()
	var ans struct {
		APIKeys []struct {
			APIKey string `json:"api_key"`
		} `json:"api_keys"`
	}
	must(t, json.Unmarshal([]byte(body), &ans))
	var keys []string
	for _, k := range ans.APIKeys {
		keys = append(keys, k.APIKey)
	}
	return keys
}

// Each tenant's reader (get tokenbudgets in its namespace, no admin path) reads the
// refusals, the config in force, explain and spend of its own tenant's keys only,
// never another tenant's nor the levels of the platform's budgets; a reader of the
// fleet's namespace reads the platform's; the admin reader reads everything. Asked of
// a real proxy process whose admin API reviews each caller with the API server.
func TestTenantScopedReads(t *testing.T) {
	backend := fakellm.New()
	backend.Set(fakellm.Behaviour{InputTokens: 100, OutputTokens: 20})
	llm := httptest.NewServer(backend)
	t.Cleanup(llm.Close)
	p := startProxy(t, fmt.Sprintf(tenantConfig, llm.URL, sum("sk-ops"), sum("sk-ann"), sum("sk-bob")), "--fleet-namespace", "tn-llm")
	for _, ns := range []string{"tn-llm", "tn-a", "tn-b"} {
		namespace(t, ns)
	}
	ann := tenantReader(t, "tn-a", "ann")
	bob := tenantReader(t, "tn-b", "bob")
	platform := tenantReader(t, "tn-llm", "platform-reader")
	admin := serviceAccount(t, "default", "tw-all", true)

	// Each key's second request of the hour is refused by its own level's budget.
	for _, k := range []string{"ops", "ann", "bob"} {
		if got := chat(t, p, "sk-"+k, k+"-1", 10); got != http.StatusOK {
			t.Fatalf("%s's first request: %d", k, got)
		}
		if got := chat(t, p, "sk-"+k, k+"-2", 10); got != http.StatusTooManyRequests {
			t.Fatalf("%s's second request: %d", k, got)
		}
	}

	t.Run("refusals", func(t *testing.T) {
		for _, c := range []struct {
			name, kc, want string
		}{
			{"tenant a", ann, "[tn-a_ann]"},
			{"tenant b", bob, "[tn-b_bob]"},
			{"the fleet's namespace", platform, "[ops]"},
			{"the admin reader", admin, "[ops tn-a_ann tn-b_bob]"},
		} {
			code, body := adminGet(t, p, c.kc, "/admin/refusals")
			if code != http.StatusOK {
				t.Fatalf("%s: %d %s", c.name, code, body)
			}
			if got := fmt.Sprint(slices.Sorted(slices.Values(refusedKeys(t, body)))); got != c.want {
				t.Errorf("%s reads the refusals of %s, want %s", c.name, got, c.want)
			}
		}
		if out := mustKubectl(t, ann, "tokenwarden", "why", "tn-a_ann", "--admin-addr", p.admin); len(table(out)) != 2 {
			t.Errorf("why of tenant a's own key, as tenant a:\n%s", out)
		}
		if out := mustKubectl(t, ann, "tokenwarden", "why", "tn-b_bob", "--admin-addr", p.admin); !strings.HasPrefix(out, "No refusal of key \"tn-b_bob\" that you may read") {
			t.Errorf("why of tenant b's key, as tenant a:\n%s", out)
		}
		if out := mustKubectl(t, admin, "tokenwarden", "why", "tn-b_bob", "--admin-addr", p.admin); len(table(out)) != 2 {
			t.Errorf("why of tenant b's key, as the admin reader:\n%s", out)
		}
	})

	t.Run("the config in force", func(t *testing.T) {
		var e struct {
			APIKeys  []struct{ Name string } `json:"api_keys"`
			Rules    []struct{ Rule string } `json:"rules"`
			Upstream []struct{ Name string } `json:"upstreams"`
		}
		code, body := adminGet(t, p, ann, "/admin/effective")
		if code != http.StatusOK {
			t.Fatalf("%d %s", code, body)
		}
		must(t, json.Unmarshal([]byte(body), &e))
		if fmt.Sprint(e.APIKeys, e.Rules, e.Upstream) != "[{tn-a_ann}] [{tn-a/cap}] []" {
			t.Errorf("tenant a reads keys %v, rules %v, upstreams %v: want its own key and rule only", e.APIKeys, e.Rules, e.Upstream)
		}
		_, body = adminGet(t, p, admin, "/admin/effective")
		must(t, json.Unmarshal([]byte(body), &e))
		if len(e.APIKeys) != 3 || len(e.Rules) != 4 || len(e.Upstream) != 1 {
			t.Errorf("the admin reader reads keys %v, rules %v, upstreams %v: want all", e.APIKeys, e.Rules, e.Upstream)
		}
	})

	t.Run("explain", func(t *testing.T) {
		var own struct {
			Items []plugin.Explained `json:"items"`
		}
		must(t, json.Unmarshal([]byte(mustKubectl(t, ann, "tokenwarden", "explain", "tn-a_ann", "--admin-addr", p.admin, "-o", "json")), &own))
		levels := map[string]string{}
		for _, b := range own.Items[0].Budgets {
			levels[b.Rule] = fmt.Sprint(b.UsedPercent != nil, b.LevelWithheld)
		}
		if fmt.Sprint(levels) != "map[llm/fleet-hour:false true tn-a/cap:true false]" {
			t.Errorf("tenant a's explain of its key: the platform's level must be withheld, its own shown (used, withheld): %v", levels)
		}
		if own.Items[0].Tightest != 2 {
			t.Errorf("tenant a's tightest is its own cap (#2), got #%d", own.Items[0].Tightest)
		}
		if out := mustKubectl(t, ann, "tokenwarden", "explain", "tn-a_ann", "--admin-addr", p.admin); !strings.Contains(out, "Use withheld: the platform's budgets' use is shown only to readers of the fleet's namespace.") {
			t.Errorf("explain as tenant a does not say the platform's use is withheld:\n%s", out)
		}
		if _, errOut, err := kubectl(t, ann, "tokenwarden", "explain", "tn-b_bob", "--admin-addr", p.admin); err == nil || !strings.Contains(errOut, "no API key named tn-b_bob") {
			t.Errorf("explain of tenant b's key, as tenant a: %v %q", err, errOut)
		}
		// The admin reader reads every level of a tenant's key; the fleet namespace's
		// reader those of the platform's key, and no tenant's key.
		for _, c := range []struct{ kc, key string }{{admin, "tn-a_ann"}, {platform, "ops"}} {
			var all struct {
				Items []plugin.Explained `json:"items"`
			}
			must(t, json.Unmarshal([]byte(mustKubectl(t, c.kc, "tokenwarden", "explain", c.key, "--admin-addr", p.admin, "-o", "json")), &all))
			for _, b := range all.Items[0].Budgets {
				if b.UsedPercent == nil || b.LevelWithheld {
					t.Errorf("explain %s reads no level of %s", c.key, b.Rule)
				}
			}
		}
		if _, errOut, err := kubectl(t, platform, "tokenwarden", "explain", "tn-a_ann", "--admin-addr", p.admin); err == nil || !strings.Contains(errOut, "no API key named tn-a_ann") {
			t.Errorf("explain of tenant a's key, as the fleet namespace's reader: %v %q", err, errOut)
		}
	})

	t.Run("spend", func(t *testing.T) {
		// The ledger flushes each second.
		var all string
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
			all = mustKubectl(t, admin, "tokenwarden", "spend", "--by", "key", "--admin-addr", p.admin)
			if len(table(all)) == 6 || time.Now().After(deadline) { // the range, the header, 3 keys, the total
				break
			}
		}
		if keys := column(table(all), 0); fmt.Sprint(keys) != "[KEY ops tn-a_ann tn-b_bob TOTAL]" {
			t.Fatalf("the admin reader's spend:\n%s", all)
		}
		if keys := column(table(mustKubectl(t, ann, "tokenwarden", "spend", "--by", "key", "--admin-addr", p.admin)), 0); fmt.Sprint(keys) != "[KEY tn-a_ann TOTAL]" {
			t.Errorf("tenant a's spend by key: %v", keys)
		}
		if keys := column(table(mustKubectl(t, platform, "tokenwarden", "spend", "--by", "team", "--admin-addr", p.admin)), 0); fmt.Sprint(keys) != "[TEAM platform TOTAL]" {
			t.Errorf("the fleet namespace's reader's spend by team: %v", keys)
		}
		rows := table(mustKubectl(t, bob, "tokenwarden", "spend", "--by", "tenant", "--admin-addr", p.admin))
		if fmt.Sprint(column(rows, 0)) != "[TENANT tn-b TOTAL]" || rows[2][1] != "1" {
			t.Errorf("tenant b's spend by tenant: %v", rows)
		}
		if code, body := adminGet(t, p, bob, "/admin/ledger/report?tenant=tn-a"); code != http.StatusForbidden {
			t.Errorf("tenant b's report of tenant a: %d %s", code, body)
		}
	})

	// Last, as it changes the config: a hand-written config moves key tn-a_ann to
	// tenant tn-b. Its refusal audited under tn-a stays tn-a's; the one it gets under
	// tn-b is tn-b's.
	t.Run("refusals of a key moved to another tenant", func(t *testing.T) {
		moved := strings.Replace(fmt.Sprintf(tenantConfig, llm.URL, sum("sk-ops"), sum("sk-ann"), sum("sk-bob")),
			"team: tn-a/research, tenant: tn-a,", "team: tn-b/research, tenant: tn-b,", 1)
		tmp := p.config + ".new"
		must(t, os.WriteFile(tmp, []byte(moved), 0o600))
		must(t, os.Rename(tmp, p.config))
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			var e struct {
				APIKeys []struct{ Name, Tenant string } `json:"api_keys"`
			}
			_, body := adminGet(t, p, admin, "/admin/effective")
			must(t, json.Unmarshal([]byte(body), &e))
			if slices.Contains(e.APIKeys, struct{ Name, Tenant string }{"tn-a_ann", "tn-b"}) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the proxy did not load the moved key: %s", body)
			}
		}
		if got := chat(t, p, "sk-ann", "ann-3", 10); got != http.StatusTooManyRequests {
			t.Fatalf("tn-a_ann's request under tn-b's cap, which bob spent: %d", got)
		}
		for _, c := range []struct {
			name, kc, want string
		}{
			{"tenant a", ann, "map[tn-a_ann:[ann-2]]"},
			{"tenant b", bob, "map[tn-a_ann:[ann-3] tn-b_bob:[bob-2]]"},
			{"the admin reader", admin, "map[ops:[ops-2] tn-a_ann:[ann-3 ann-2] tn-b_bob:[bob-2]]"},
		} {
			code, body := adminGet(t, p, c.kc, "/admin/refusals")
			if code != http.StatusOK {
				t.Fatalf("%s: %d %s", c.name, code, body)
			}
			if got := fmt.Sprint(refusedIDs(t, body)); got != c.want {
				t.Errorf("%s reads the refusals %s, want %s", c.name, got, c.want)
			}
		}
	})
}

// refusedIDs are the request ids of an /admin/refusals answer by key, newest first.
func refusedIDs(t *testing.T, body string) map[string][]string {
	t.Helper()
	var ans struct {
		APIKeys []struct {
			APIKey   string `json:"api_key"`
			Refusals []struct {
				RequestID string `json:"request_id"`
			} `json:"refusals"`
		} `json:"api_keys"`
	}
	must(t, json.Unmarshal([]byte(body), &ans))
	out := map[string][]string{}
	for _, k := range ans.APIKeys {
		for _, r := range k.Refusals {
			out[k.APIKey] = append(out[k.APIKey], r.RequestID)
		}
	}
	return out
}

// column is column i of a spend table's rows, after its first line (the range).
func column(rows [][]string, i int) []string {
	var out []string
	for _, r := range rows[1:] {
		if i < len(r) {
			out = append(out, r[i])
		}
	}
	return out
}
