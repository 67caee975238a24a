// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package plugin_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	twv1alpha1 "github.com/tokenwarden/tokenwarden/api/v1alpha1"
	"github.com/tokenwarden/tokenwarden/plugin"
	"github.com/tokenwarden/tokenwarden/proxy/attribute"
	"github.com/tokenwarden/tokenwarden/test/fakellm"
	"github.com/tokenwarden/tokenwarden/test/testproc"
)

// replicaConfig is two replicas' config in memory mode: alice (team research, whose
// team has a rule of its own) and batch (team batch, a day budget of its own of 1,000
// tokens and a team rule of two requests an hour).
const replicaConfig = `
upstreams: [{name: local, url: %q}]
auth: {mode: required}
api_keys:
- {name: alice, user: alice, team: research, key_sha256: %q, rate_limit_tokens_per_minute: 40000}
- {name: batch, user: batch, team: batch, key_sha256: %q, rate_limit_tokens_per_day: 1000}
ledger: {flush_interval_seconds: 1}
rate_limiting:
  storage: memory
  budget_division: {replicas: 2}
  limits:
    per_api_key: {tokens_per_minute: 30000, tokens_per_day: 2000000}
    per_team: {tokens_per_minute: 50000}
  rules:
  - {name: llm/research, dimension: team, subjects: [research], windows: [{limit: 60000, rolling: {period: minute}}]}
  - {name: llm/batch-team, dimension: team, subjects: [batch], amount: requests, windows: [{limit: 2, rolling: {period: hour}}]}
`

// proxyProc is one proxy process: its data and admin addresses.
type proxyProc struct {
	url, admin string
	// config is the path of the config document it serves, reloaded when it changes.
	config string
}

// startProxy runs the proxy binary on config (and args) with the admin API authenticated by the
// test API server (--admin-auth=kubernetes), and waits until it serves.
func startProxy(t *testing.T, config string, args ...string) proxyProc {
	t.Helper()
	dir := t.TempDir()
	path := filepath.Join(dir, "proxy.yaml")
	must(t, os.WriteFile(path, []byte(config), 0o600))
	port, err := testproc.FreePort()
	must(t, err)
	adminPort, err := testproc.FreePort()
	must(t, err)
	p := proxyProc{url: fmt.Sprintf("http://127.0.0.1:%d", port), admin: fmt.Sprintf("127.0.0.1:%d", adminPort), config: path}
	var log bytes.Buffer
	cmd := exec.Command(filepath.Join(binDir, "proxy"), append([]string{"--config", path, "--admin-auth", "kubernetes", "--kubeconfig", adminKC,
		"--listen", strings.TrimPrefix(p.url, "http://"), "--admin-listen", p.admin, "--drain-delay", "0s"}, args...)...)
	cmd.Stdout, cmd.Stderr = &log, &log
	must(t, cmd.Start())
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		resp, err := http.Get("http://" + p.admin + "/readyz")
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return p
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the proxy did not become ready: %v\n%s", err, log.String())
		}
	}
}

// chat sends one chat completion as key with the request id given, and returns the
// status.
func chat(t *testing.T, p proxyProc, key, id string, maxTokens int) int {
	t.Helper()
	body := fmt.Sprintf(`{"model":"demo","max_tokens":%d,"messages":[{"role":"user","content":"Summarise the catalogue."}]}`, maxTokens)
	req, err := http.NewRequest(http.MethodPost, p.url+"/v1/chat/completions", strings.NewReader(body))
	must(t, err)
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("X-Request-Id", id)
	resp, err := http.DefaultClient.Do(req)
	must(t, err)
	_ = resp.Body.Close()
	return resp.StatusCode
}

// chatAs sends one chat completion as key with the attribute headers given (name,
// value pairs), and returns the status.
func chatAs(t *testing.T, p proxyProc, key string, hdr ...string) int {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, p.url+"/v1/chat/completions",
		strings.NewReader(`{"model":"demo","max_tokens":10,"messages":[{"role":"user","content":"Next step."}]}`))
	must(t, err)
	req.Header.Set("Authorization", "Bearer "+key)
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	must(t, err)
	_ = resp.Body.Close()
	return resp.StatusCode
}

func sum(s string) string { return fmt.Sprintf("%x", sha256.Sum256([]byte(s))) }

// serviceAccount creates a ServiceAccount in ns, binds it to the ClusterRole the
// repository ships for reading the proxies' admin API when reader is set, and writes
// a kubeconfig that authenticates with a token of it.
func serviceAccount(t *testing.T, ns, name string, reader bool) string {
	t.Helper()
	ctx := context.Background()
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	must(t, k8s.Create(ctx, sa))
	if reader {
		must(t, k8s.Create(ctx, &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: ns + "-" + name},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: adminReaderRole(t)},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: name}},
		}))
	}
	tr := &authnv1.TokenRequest{Spec: authnv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)}}
	must(t, k8s.SubResource("token").Create(ctx, sa, tr))
	return tokenKubeconfig(t, name, tr.Status.Token)
}

// tokenKubeconfig is a kubeconfig of the test API server whose user is a bearer token.
func tokenKubeconfig(t *testing.T, name, token string) string {
	t.Helper()
	kc := clientcmdapi.NewConfig()
	kc.Clusters["envtest"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos[name] = &clientcmdapi.AuthInfo{Token: token}
	kc.Contexts["envtest"] = &clientcmdapi.Context{Cluster: "envtest", AuthInfo: name, Namespace: "llm"}
	kc.CurrentContext = "envtest"
	path := filepath.Join(t.TempDir(), name+".kubeconfig")
	must(t, clientcmd.WriteToFile(*kc, path))
	return path
}

// adminReaderRole installs config/rbac's ClusterRole for the proxies' admin API once.
func adminReaderRole(t *testing.T) string {
	t.Helper()
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "tokenwarden-proxy-admin-reader"},
		Rules: []rbacv1.PolicyRule{{NonResourceURLs: []string{"/admin/*"}, Verbs: []string{"get"}}}}
	if err := k8s.Create(context.Background(), role); err != nil && !strings.Contains(err.Error(), "already exists") {
		t.Fatal(err)
	}
	return role.Name
}

// volatile are the parts of an output that differ from run to run: the times of the
// refusals, the replicas' ports.
var volatile = []struct {
	re   *regexp.Regexp
	with string
}{
	{regexp.MustCompile(`\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z`), "2026-12-01T12:00:00Z"},
	{regexp.MustCompile(`127\.0\.0\.1:\d+`), "127.0.0.1:PORT"},
}

func stable(s string) string {
	for _, v := range volatile {
		s = v.re.ReplaceAllString(s, v.with)
	}
	return s
}

// attributeConfig is one replica's config with rules that select on the agent and
// count by the session (one of them two requests in flight per session) and by the
// serving upstream, and a bound of two sessions.
const attributeConfig = `
upstreams: [{name: local, url: %q}]
auth: {mode: required}
api_keys:
- {name: alice, user: alice, team: research, key_sha256: %q}
rate_limiting:
  storage: memory
  max_attribute_values: 2
  rules:
  - {name: llm/planner-sessions, dimension: api_key, count_by: session, applies_when: {agent: [planner]}, amount: requests, windows: [{limit: 100, rolling: {period: minute}}]}
  - {name: llm/planner-in-flight, dimension: api_key, count_by: session, applies_when: {agent: [planner]}, amount: in_flight, windows: [{limit: 2}]}
  - {name: llm/per-upstream, dimension: global, count_by: provider, windows: [{limit: 100000, rolling: {period: minute}}]}
  - {name: llm/coder, dimension: api_key, applies_when: {agent: [coder]}, amount: requests, windows: [{limit: 10, rolling: {period: minute}}]}
`

// holdHeader makes the test backend hold a request until the test lets it go.
const holdHeader = "X-Test-Hold"

// explain names, for each rule that selects on or counts by an attribute, the
// request's values and the counter they land in; a session beyond the key's bound in
// the overflow subject; the rule the agent keeps out; and an in-flight rule's
// requests in flight now, of its limit, and whose they are.
func TestExplainAttributes(t *testing.T) {
	hold, held := make(chan struct{}), make(chan struct{}, 1)
	backend := fakellm.New()
	llm := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get(holdHeader) != "" {
			held <- struct{}{}
			<-hold
		}
		backend.ServeHTTP(w, r)
	}))
	t.Cleanup(llm.Close)
	p := startProxy(t, fmt.Sprintf(attributeConfig, llm.URL, sum("sk-alice")))
	addrs := "--admin-addr=" + p.admin
	reader := serviceAccount(t, "default", "tw-attr-reader", true)
	for _, s := range []string{"s-1", "s-2"} {
		if got := chatAs(t, p, "sk-alice", attribute.AgentHeader, "planner", attribute.SessionHeader, s); got != http.StatusOK {
			t.Fatalf("alice's request in session %s: %d", s, got)
		}
	}
	// One request of session s-2 stays in flight while explain is asked.
	done := make(chan int, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, p.url+"/v1/chat/completions",
			strings.NewReader(`{"model":"demo","max_tokens":10,"messages":[{"role":"user","content":"Next step."}]}`))
		req.Header.Set("Authorization", "Bearer sk-alice")
		req.Header.Set(attribute.AgentHeader, "planner")
		req.Header.Set(attribute.SessionHeader, "s-2")
		req.Header.Set(holdHeader, "1")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			done <- 0
			return
		}
		_ = resp.Body.Close()
		done <- resp.StatusCode
	}()
	<-held
	released := false
	release := func() {
		if !released {
			released = true
			close(hold)
			if got := <-done; got != http.StatusOK {
				t.Errorf("the request held in flight: %d", got)
			}
		}
	}
	t.Cleanup(release)

	known := mustKubectl(t, reader, "tokenwarden", "explain", "alice", "--model", "demo", "--agent", "planner", "--session", "s-2", addrs)
	for _, s := range []string{
		"Request attributes: agent planner, endpoint chat_completions, provider openai, session s-2, upstream local.",
		"#1 llm/planner-in-flight in_flight selects agent planner, counts by session s-2: counter api_key alice by session s-2.",
		"#1 llm/planner-in-flight in flight: 1 of 2 on this replica: each replica holds the limit on its own, not divided.",
		"#2 llm/planner-sessions minute selects agent planner, counts by session s-2: counter api_key alice by session s-2.",
		"#3 llm/per-upstream minute counts by provider local: counter global by provider local.",
		"llm/coder minute does not apply: agent planner is not one of coder.",
	} {
		if !strings.Contains(known, s) {
			t.Errorf("explain does not say %q:\n%s", s, known)
		}
	}
	if strings.Contains(known, "overflow") {
		t.Errorf("a session the key has sent is its own:\n%s", known)
	}

	over := mustKubectl(t, reader, "tokenwarden", "explain", "alice", "--model", "demo", "--agent", "planner", "--session", "s-3", addrs)
	golden(t, "explain-attributes.txt", stable(over))
	want := "the key has sent max_attribute_values (2) other session values this window: this one is counted in the overflow subject (beyond max_attribute_values)"
	if !strings.Contains(over, want) || !strings.Contains(over, "by session (beyond max_attribute_values)") {
		t.Errorf("explain of a third session does not say it lands in the overflow subject:\n%s", over)
	}
	var asJSON struct {
		Items []plugin.Explained `json:"items"`
	}
	must(t, json.Unmarshal([]byte(mustKubectl(t, reader, "tokenwarden", "explain", "alice", "--model", "demo", "--agent", "planner", "--session", "s-3", addrs, "-o", "json")), &asJSON))
	if b := asJSON.Items[0].Budgets[1]; !b.Overflow || b.By != "(beyond max_attribute_values)" || b.Attributes[1].Value != "s-3" {
		t.Errorf("the JSON of the overflowed session: %+v", b)
	}

	// The JSON of the session in flight; and its slot back once it ends.
	asJSON.Items = nil
	must(t, json.Unmarshal([]byte(mustKubectl(t, reader, "tokenwarden", "explain", "alice", "--model", "demo", "--agent", "planner", "--session", "s-2", addrs, "-o", "json")), &asJSON))
	if b := asJSON.Items[0].Budgets[0]; b.Window != "in_flight" || b.Limit != 2 || b.InFlight == nil || *b.InFlight != 1 || b.InFlightOf != "replica" ||
		b.UsedPercent == nil || *b.UsedPercent != 50 {
		t.Errorf("the JSON of the in-flight window of s-2 with one request in flight: %+v", b)
	}
	release()
	want = "#1 llm/planner-in-flight in flight: 0 of 2 on this replica"
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		after := mustKubectl(t, reader, "tokenwarden", "explain", "alice", "--model", "demo", "--agent", "planner", "--session", "s-2", addrs)
		if strings.Contains(after, want) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("explain after the request in flight ended does not say %q:\n%s", want, after)
		}
	}
}

// Two real proxies serve traffic and refusals; why merges their audits newest first,
// explain shows the proxies' own resolution, each asked through the real kubectl with
// a ServiceAccount's token; callers without access get one line.
func TestWhyAndExplain(t *testing.T) {
	backend := fakellm.New()
	backend.Set(fakellm.Behaviour{InputTokens: 1200, OutputTokens: 300})
	llm := httptest.NewServer(backend)
	t.Cleanup(llm.Close)
	conf := fmt.Sprintf(replicaConfig, llm.URL, sum("sk-alice"), sum("sk-batch"))
	a, b := startProxy(t, conf), startProxy(t, conf)
	addrs := "--admin-addr=" + a.admin + "," + b.admin
	reader := serviceAccount(t, "default", "tw-reader", true)

	// Before any traffic every budget is whole: the golden files hold no level that
	// moves with the clock.
	explain := mustKubectl(t, reader, "tokenwarden", "explain", "alice", "--model", "demo", addrs)
	golden(t, "explain.txt", stable(explain))
	golden(t, "explain-wide.txt", stable(mustKubectl(t, reader, "tokenwarden", "explain", "alice", "--model", "demo", addrs, "-o", "wide")))
	golden(t, "explain.json", stable(mustKubectl(t, reader, "tokenwarden", "explain", "alice", "--model", "demo", addrs, "-o", "json")))
	for _, s := range []string{
		"the key's own   api_key alice   minute   tokens   40000   20000",
		"llm/research    team research   minute   tokens   60000   30000",
		"limits team minute is replaced by rule llm/research minute.",
		"limits api_key minute is replaced by the key's own minute limit.",
	} {
		if !strings.Contains(strings.Join(strings.Fields(explain), " "), strings.Join(strings.Fields(s), " ")) {
			t.Errorf("explain does not say %q:\n%s", s, explain)
		}
	}

	if chat(t, a, "sk-alice", "alice-1", 100) != http.StatusOK {
		t.Fatal("alice's request was not answered")
	}
	// At once after alice's request (a minute budget refills within seconds), the
	// replica that served it shows her use of each budget, the other none, and one of
	// them is the tightest.
	var after struct {
		Items []plugin.Explained `json:"items"`
	}
	must(t, json.Unmarshal([]byte(mustKubectl(t, reader, "tokenwarden", "explain", "alice", "--model", "demo", addrs, "-o", "json")), &after))
	e := after.Items[0]
	if len(e.Used) != 3 || e.Tightest == 0 {
		t.Fatalf("explain after traffic: %+v", e)
	}
	for i, used := range e.Used {
		if len(used) != 2 || used[0] == nil || *used[0] <= 0 || used[1] == nil || *used[1] != 0 {
			t.Errorf("budget %d: each replica's use %v, want replica a's above 0 and b's 0", i+1, used)
		}
	}

	// batch: larger than its day budget on replica a; its team's second request of
	// the hour on replica b.
	if got := chat(t, a, "sk-batch", "batch-1", 2000); got != http.StatusTooManyRequests {
		t.Fatalf("batch's large request: %d", got)
	}
	if chat(t, b, "sk-batch", "batch-2", 10) != http.StatusOK {
		t.Fatal("batch's small request was not answered")
	}
	if got := chat(t, b, "sk-batch", "batch-3", 10); got != http.StatusTooManyRequests {
		t.Fatalf("batch's second request of the hour: %d", got)
	}

	why := mustKubectl(t, reader, "tokenwarden", "why", "batch", addrs)
	rows := table(why)
	want := [][]string{
		{"TIME", "ROUTE", "MODEL", "REFUSED BY", "WINDOW", "ASKED", "LEFT", "RETRY AFTER"},
		{"2026-12-01T12:00:00Z", "/v1/chat/completions", "demo", "a team rule", "hour", "1", "-", "60m"},
		{"2026-12-01T12:00:00Z", "/v1/chat/completions", "demo", "api_key tokens", "day"},
	}
	if len(rows) != 3 || fmt.Sprint(stableRows(rows[:2])) != fmt.Sprint(want[:2]) || fmt.Sprint(stableRows(rows[2:])[0][:5]) != fmt.Sprint(want[2]) {
		t.Errorf("why batch, newest first:\n%s", why)
	} else if !strings.HasPrefix(rows[2][6], "500/500") || !strings.HasSuffix(rows[2][7], "(larger than the budget)") {
		t.Errorf("the day budget's refusal shows what was left of the key's own budget and that no wait lets it in:\n%s", why)
	}
	golden(t, "why.txt", stable(why))
	golden(t, "why-wide.txt", stable(mustKubectl(t, reader, "tokenwarden", "why", "batch", addrs, "-o", "wide")))
	golden(t, "why.json", stable(mustKubectl(t, reader, "tokenwarden", "why", "batch", addrs, "-o", "json")))
	if out := mustKubectl(t, reader, "tokenwarden", "why", "alice", addrs); out != "No refusal of key \"alice\" in the audit of 2 replicas.\n" {
		t.Errorf("why alice: %q", out)
	}

	// The spend ledger of replica a (a standalone proxy records into a SQLite file of
	// its own) holds alice's request once it has flushed.
	var spend string
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		spend = mustKubectl(t, reader, "tokenwarden", "spend", "--by", "team", "--admin-addr", a.admin)
		if strings.Contains(spend, "research") || time.Now().After(deadline) {
			break
		}
	}
	if rows := table(spend); len(rows) != 4 || strings.Join(rows[2], " ") != "research 1 1200 300 0 0.000000" {
		t.Errorf("spend --by team:\n%s", spend)
	}
	golden(t, "spend.txt", stable(spend))
	golden(t, "spend.json", stable(mustKubectl(t, reader, "tokenwarden", "spend", "--by", "key", "--admin-addr", a.admin, "-o", "json")))
	if csv := mustKubectl(t, reader, "tokenwarden", "spend", "--by", "user", "--admin-addr", a.admin, "-o", "csv"); !strings.Contains(csv, ",alice,1,1200,300,") {
		t.Errorf("spend -o csv:\n%s", csv)
	}
	// --since and --from/--to choose the range: the last hour holds alice's request, a
	// range that ended an hour ago none of it.
	if rows := table(mustKubectl(t, reader, "tokenwarden", "spend", "--by", "model", "--since", "1h", "--admin-addr", a.admin)); len(rows) != 4 ||
		strings.Join(rows[2][:4], " ") != "demo 1 1200 300" {
		t.Errorf("spend --by model --since 1h:\n%v", rows)
	}
	before := time.Now().Add(-time.Hour).UTC().Format(time.RFC3339)
	if rows := table(mustKubectl(t, reader, "tokenwarden", "spend", "--by", "model", "--from", "2026-01-01", "--to", before, "--admin-addr", a.admin)); len(rows) != 3 ||
		strings.Join(rows[2][:2], " ") != "TOTAL 0" || rows[0][0] != "Spend from 2026-01-01T00:00:00Z to "+before+"." {
		t.Errorf("spend --from 2026-01-01 --to %s:\n%v", before, rows)
	}

	// One line for each caller who may not: a bad token, no bearer token.
	nobody := serviceAccount(t, "default", "tw-nobody", false)
	for _, c := range []struct {
		name, kc, want string
	}{
		{"a bad token", tokenKubeconfig(t, "forged", "not-a-token"), "error: unauthorized: replica " + a.admin + " did not accept the bearer token (the bearer token is not valid); pass one it accepts with --admin-token"},
		{"a client certificate", adminKC, "error: the kubeconfig's user has no bearer token (it authenticates with a client certificate or a password), and a replica's admin API takes only a bearer token: pass one with --admin-token"},
	} {
		_, errOut, err := kubectl(t, c.kc, "tokenwarden", "why", "batch", addrs)
		if err == nil || !strings.HasPrefix(errOut, c.want) || strings.Count(errOut, "\n") != 1 {
			t.Errorf("%s: %v %q, want one line starting %q", c.name, err, errOut, c.want)
		}
	}
	// A caller bound to nothing reads no tenant's refusals, and is told so.
	if out := mustKubectl(t, nobody, "tokenwarden", "why", "batch", addrs); !strings.HasPrefix(out, `No refusal of key "batch" that you may read in the audit of 2 replicas`) {
		t.Errorf("why as a caller bound to nothing: %q", out)
	}
	// The certificate's holder presents a token of their own instead.
	token := strings.TrimSpace(mustKubectl(t, adminKC, "create", "token", "tw-reader", "-n", "default"))
	if out := mustKubectl(t, adminKC, "tokenwarden", "why", "batch", addrs, "--admin-token", token); len(table(out)) != 3 {
		t.Errorf("why with --admin-token:\n%s", out)
	}
	if _, errOut, err := kubectl(t, reader, "tokenwarden", "explain", "mallory", addrs); err == nil || !strings.Contains(errOut, "no API key named mallory in the config in force") {
		t.Errorf("explain of an unknown key: %v %q", err, errOut)
	}
}

func stableRows(rows [][]string) [][]string {
	out := make([][]string, len(rows))
	for i, r := range rows {
		out[i] = make([]string, len(r))
		for j, c := range r {
			out[i][j] = stable(c)
		}
	}
	return out
}

// Without --admin-addr the plugin port-forwards to each running pod of the fleet: the
// API server decides who may list the pods and port-forward, and a refusal or a pod it
// cannot reach is one line. (The test API server has no kubelet: a port-forward that
// RBAC allows ends at the node.)
func TestPortForward(t *testing.T) {
	ctx := context.Background()
	namespace(t, "pf")
	must(t, k8s.Create(ctx, &twv1alpha1.TokenProxy{
		ObjectMeta: metav1.ObjectMeta{Name: "fleet", Namespace: "pf"},
		Spec:       twv1alpha1.TokenProxySpec{Upstreams: []twv1alpha1.Upstream{{Name: "vllm", URL: "http://vllm:8000"}}},
	}))
	why := func(kc string) (string, error) {
		_, errOut, err := kubectl(t, kc, "tokenwarden", "why", "batch", "-n", "pf", "--admin-token", "t")
		if err != nil && strings.Count(errOut, "\n") != 1 {
			t.Errorf("more than one line: %q", errOut)
		}
		return errOut, err
	}
	if out, err := why(adminKC); err == nil || out != "error: no replica of TokenProxy \"fleet\" is running in namespace \"pf\" (0 pods)\n" {
		t.Errorf("no pod: %v %q", err, out)
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "fleet-proxy-0", Namespace: "pf",
			Labels: map[string]string{"app.kubernetes.io/name": "tokenwarden-proxy", "app.kubernetes.io/instance": "fleet"}},
		Spec: corev1.PodSpec{NodeName: "node-1", Containers: []corev1.Container{{Name: "proxy", Image: "tokenwarden:dev",
			Ports: []corev1.ContainerPort{{Name: "admin", ContainerPort: 9090}}}}},
	}
	must(t, k8s.Create(ctx, pod))
	pod.Status.Phase = corev1.PodRunning
	must(t, k8s.Status().Update(ctx, pod))

	role := func(user string, rules ...rbacv1.PolicyRule) string {
		must(t, k8s.Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: user, Namespace: "pf"}, Rules: rules}))
		must(t, k8s.Create(ctx, &rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: user, Namespace: "pf"},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: user},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}},
		}))
		kc, err := kubeconfig(t.TempDir(), envtest.User{Name: user})
		must(t, err)
		return kc
	}
	fleets := rbacv1.PolicyRule{APIGroups: []string{"tokenwarden.io"}, Resources: []string{"tokenproxies"}, Verbs: []string{"get", "list"}}
	pods := rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"list"}}
	forward := rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"pods/portforward"}, Verbs: []string{"create"}}
	for _, c := range []struct {
		name, kc, want string
	}{
		{"no RBAC", role("pf-none"), `error: forbidden: you may not list tokenproxies.tokenwarden.io in namespace "pf"; `},
		{"fleets only", role("pf-fleets", fleets), `error: forbidden: you may not list pods in namespace "pf"; `},
		{"no port-forward", role("pf-pods", fleets, pods),
			`error: forbidden: you may not create pods/portforward in namespace "pf", which reaching the replicas' admin API needs; ask for a Role that grants it, or reach a replica directly with --admin-addr`},
		{"allowed", role("pf-forward", fleets, pods, forward), `error: cannot port-forward to pod fleet-proxy-0 in namespace "pf": `},
		{"an administrator", adminKC, `error: cannot port-forward to pod fleet-proxy-0 in namespace "pf": `},
	} {
		out, err := why(c.kc)
		t.Logf("%s: %s", c.name, out)
		if err == nil || !strings.HasPrefix(out, c.want) || strings.Contains(out, "goroutine") {
			t.Errorf("%s: %v %q, want one line starting %q", c.name, err, out, c.want)
		}
	}
}
