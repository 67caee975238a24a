// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

// Command demo runs the whole system on this machine and tells its story: a local
// control plane, the operator, the fake LLM backend, config/samples applied, and one
// proxy process per replica of the TokenProxy. Before each step that depends on a
// change it has applied, it waits until every proxy has applied the config generation
// that holds the change. With DEMO_ONCE=1 it exits after the story, with status 0 only
// if every step behaved as told; otherwise the stack stays up until Ctrl-C.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/tokenwarden/tokenwarden/test/fakellm"
	"github.com/tokenwarden/tokenwarden/test/stack"
)

const ns = "demo"

// enforceTimeout bounds each wait for the fleet to apply a change: generous, so that a
// loaded machine is slow rather than wrong; the time taken is printed.
const enforceTimeout = 2 * time.Minute

type story struct {
	failed []string
}

func (s *story) step(n int, title string) { fmt.Printf("\n\033[1m%d. %s\033[0m\n", n, title) }

func (s *story) check(ok bool, what string) {
	mark := "\033[32m✓\033[0m"
	if !ok {
		mark = "\033[31m✗\033[0m"
		s.failed = append(s.failed, what)
	}
	fmt.Printf("   %s %s\n", mark, what)
}

func say(format string, args ...any) { fmt.Printf("   "+format+"\n", args...) }

func indent(text string) {
	for _, line := range strings.Split(strings.TrimRight(text, "\n"), "\n") {
		fmt.Println("     " + line)
	}
}

type answer struct {
	code   int
	header http.Header
	body   map[string]any
}

func chat(url, key string, maxTokens int) (answer, error) {
	body := fmt.Sprintf(`{"model":"demo","max_tokens":%d,"messages":[{"role":"user","content":"Summarise the catalogue for me."}]}`, maxTokens)
	req, _ := http.NewRequest("POST", url+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return answer{}, err
	}
	defer func() { _ = resp.Body.Close() }()
	a := answer{code: resp.StatusCode, header: resp.Header}
	data, _ := io.ReadAll(resp.Body)
	_ = json.Unmarshal(data, &a.body)
	return a, nil
}

func errorMessage(a answer) string {
	if e, ok := a.body["error"].(map[string]any); ok {
		if m, ok := e["message"].(string); ok {
			return m
		}
	}
	return ""
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	root, err := os.Getwd()
	if err == nil {
		err = run(ctx, options{Root: root, Once: os.Getenv("DEMO_ONCE") == "1", NeedRedis: os.Getenv("DEMO_NEED_REDIS") == "1"})
	}
	stop()
	if err != nil {
		fmt.Fprintf(os.Stderr, "\ndemo: %v\n", err)
		os.Exit(1)
	}
}

// options configure one run of the demo.
type options struct {
	// Root is the repository root (config/samples, the CRDs, the tools in bin/).
	Root string
	// Once ends the run after the story, with an error if a step did not behave;
	// otherwise the stack stays up until ctx is done.
	Once bool
	// ProxyBinary is the proxy to run; default bin/proxy.
	ProxyBinary string
	// LogPath receives the control plane's and the operator's logs; default
	// tokenwarden-demo.log in the temporary directory.
	LogPath string
	// NeedRedis makes a missing redis-server a failed step; otherwise the story skips
	// the Redis-backed fleet and says how to install it.
	NeedRedis bool
	// PluginDir holds the kubectl plugin kubectl-tokenwarden; default bin/.
	PluginDir string
}

func run(ctx context.Context, o options) error {
	if o.LogPath == "" {
		o.LogPath = filepath.Join(os.TempDir(), "tokenwarden-demo.log")
	}
	logf, err := os.Create(o.LogPath)
	if err != nil {
		return err
	}
	defer func() { _ = logf.Close() }()

	st := &story{}
	fmt.Println("\033[1mtokenwarden demo\033[0m: a control plane, the operator, a fake LLM backend and a fleet of proxies, all on this machine.")
	say("(control plane and operator logs: %s)", o.LogPath)
	s, err := stack.Start(ctx, stack.Options{Root: o.Root, LLMAddr: "127.0.0.1:0", Log: logf, ProxyBinary: o.ProxyBinary,
		Behaviour: fakellm.Behaviour{InputTokens: 1200, OutputTokens: 300}})
	if err != nil {
		return err
	}
	defer s.Stop()
	say("kube-apiserver and etcd are up; the CRDs are installed; the operator is running.")
	say("The fake backend answers every request with 1,200 input and 300 output tokens, at %s.", s.LLMURL)

	if _, err := s.Kubectl("create", "namespace", ns); err != nil {
		return err
	}
	out, err := s.Kubectl("apply", "-n", ns, "-k", "config/samples")
	if err != nil {
		return err
	}
	say("kubectl apply -n %s -k config/samples", ns)
	indent(out)
	patch := fmt.Sprintf(`[{"op":"replace","path":"/spec/upstreams/0/url","value":%q}]`, s.LLMURL)
	if _, err := s.Kubectl("patch", "tp/fleet", "-n", ns, "--type=json", "-p", patch); err != nil {
		return err
	}
	say("kubectl patch tp/fleet: its upstream is the fake backend.")
	patched := time.Now()
	proxies, err := s.SyncProxies(ctx, ns, "fleet")
	if err != nil {
		return err
	}
	say("Started %d proxy processes, one per replica, each watching ConfigMap %s/fleet-proxy as a pod would.", len(proxies), ns)
	generation, err := s.WaitEnforced(ctx, ns, "fleet", enforceTimeout)
	if err != nil {
		return err
	}
	say("Waited until every proxy applied config generation %d, the one with the fake backend and both keys (%.1fs after the patch).",
		generation, time.Since(patched).Seconds())
	if err := stack.CheckDivisor(ctx, proxies, 3); err != nil {
		return err
	}
	p0 := proxies[0].URL

	st.step(1, "Traffic inside the budget is answered")
	a, err := chat(p0, "sk-demo-alice", 500)
	if err != nil {
		return err
	}
	say("alice → POST /v1/chat/completions: %d, x-ratelimit-tokens-remaining: %s of %s (her key's minute budget on this replica)",
		a.code, a.header.Get("X-Ratelimit-Tokens-Remaining"), a.header.Get("X-Ratelimit-Tokens-Limit"))
	st.check(a.code == 200, "alice is answered 200")
	st.check(a.header.Get("X-Ratelimit-Tokens-Limit") == "10000", "her per-key budget of 30,000 a minute is 10,000 on each of 3 replicas")

	st.step(2, "A batch job exhausts its minute budget and gets 429 with Retry-After; alice is still served")
	say("The batch key's own minute budget is 6,000 for the fleet: 2,000 per replica. Each call uses 1,500.")
	var refused answer
	for i := 1; i <= 4; i++ {
		b, err := chat(p0, "sk-demo-batch", 1000)
		if err != nil {
			return err
		}
		say("batch call %d: %d", i, b.code)
		if b.code == 429 {
			refused = b
			break
		}
	}
	st.check(refused.code == 429, "the batch job is refused with 429")
	st.check(refused.header.Get("Retry-After") != "", "the refusal carries Retry-After: "+refused.header.Get("Retry-After")+" s, the time its own cost needs to refill")
	if m := errorMessage(refused); m != "" {
		say("body: %s", m)
	}
	a, err = chat(p0, "sk-demo-alice", 500)
	if err != nil {
		return err
	}
	st.check(a.code == 200, "alice, another tenant on the same proxy, is still answered 200")

	st.step(3, "kubectl get tokenbudgets shows what each replica enforces")
	out, err = s.Kubectl("get", "tokenbudgets", "-n", ns)
	if err != nil {
		return err
	}
	indent(out)
	perReplica, err := s.Kubectl("get", "tb/per-key", "-n", ns, "-o", "jsonpath={.status.perReplica.tokensPerMinute}")
	if err != nil {
		return err
	}
	st.check(strings.TrimSpace(perReplica) == "10000", "per-key: 30,000 a minute for the fleet, 10k (10,000) per replica")

	st.step(4, "kubectl scale tp/fleet --replicas=4 re-divides every budget and every proxy reloads")
	if _, err := s.Kubectl("scale", "tp/fleet", "-n", ns, "--replicas=4"); err != nil {
		return err
	}
	scaled := time.Now()
	if proxies, err = s.SyncProxies(ctx, ns, "fleet"); err != nil {
		return err
	}
	if generation, err = s.WaitEnforced(ctx, ns, "fleet", enforceTimeout); err != nil {
		say("%v", err)
	} else {
		err = stack.CheckDivisor(ctx, proxies, 4)
	}
	st.check(err == nil, fmt.Sprintf("all %d proxies applied config generation %d and enforce 1/4 of each budget, %.1fs after the scale",
		len(proxies), generation, time.Since(scaled).Seconds()))
	out, err = s.Kubectl("get", "tokenbudgets", "-n", ns)
	if err != nil {
		return err
	}
	indent(out)
	if perReplica, err = s.Kubectl("get", "tb/per-key", "-n", ns, "-o", "jsonpath={.status.perReplica.tokensPerMinute}"); err != nil {
		return err
	}
	st.check(strings.TrimSpace(perReplica) == "7500", "per-key: 7.5k (7,500) per replica now")
	// The control plane counts the replicas from their own reports (a Lease each):
	// the fourth reports itself once it has loaded the config.
	var enforcedOut string
	deadline := time.Now().Add(enforceTimeout)
	for {
		enforcedOut, err = s.Kubectl("get", "tp/fleet", "-n", ns, "-o", "jsonpath={.status.enforced}")
		if (err == nil && enforcedOut == "4/4") || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if out, err = s.Kubectl("get", "tp", "-n", ns); err == nil {
		indent(out)
	}
	st.check(enforcedOut == "4/4", "kubectl get tp: ENFORCED 4/4, every live replica reports the current config generation")

	var redisProxies []*stack.Proxy
	ledgerURL, stopLedger := startLedgerDB()
	defer stopLedger()
	if err := redisFleet(ctx, s, st, o.NeedRedis, ledgerURL, &redisProxies); err != nil {
		return err
	}

	st.step(6, "The metrics each proxy exports (an excerpt)")
	shown := excerpt(proxies[0].AdminURL, func(line string) bool {
		return strings.HasPrefix(line, "rate_limit_token_budget_tokens_total{dimension=\"api_key\"") ||
			strings.HasPrefix(line, "rate_limit_token_budget_refusals_total{dimension=\"api_key\"") ||
			strings.HasPrefix(line, "tokenwarden_api_key_usage_tokens_total") ||
			strings.HasPrefix(line, "tokenwarden_budget_division_replicas")
	})
	if len(redisProxies) > 0 {
		say("and on the Redis fleet, the spend in dollars and each rule window's level, limit and reset:")
		spend := excerpt(redisProxies[0].AdminURL, func(line string) bool {
			return strings.HasPrefix(line, "tokenwarden_spend_dollars_total") ||
				strings.HasPrefix(line, "tokenwarden_rule_window_")
		})
		st.check(spend > 0, "the proxy exports spend and rule levels: the dashboard's cost panel and near-limit table read them")
	}
	st.check(shown > 0, "the proxy counts reserved, refunded and refused tokens per dimension and per key")

	if err := cacheStory(ctx, st, s, proxies); err != nil {
		return err
	}
	spendStory(st, s, o, redisProxies, ledgerURL)
	pluginStory(st, s, o, proxies)

	fmt.Println()
	if len(st.failed) > 0 {
		fmt.Printf("\033[31m%d step(s) did not behave as told:\033[0m %s\n", len(st.failed), strings.Join(st.failed, "; "))
		if o.Once {
			return fmt.Errorf("the demo failed")
		}
	} else {
		fmt.Println("\033[32mEvery step behaved as told.\033[0m")
		fmt.Printf("The fleet is on config generation %d on every proxy.\n", generation)
	}
	if o.Once {
		return nil
	}
	fmt.Printf("\nThe stack stays up until Ctrl-C.\n   export KUBECONFIG=%s\n", s.Kubeconfig)
	for i, p := range s.Proxies(ns, "fleet") {
		fmt.Printf("   proxy %d: %s (admin %s)\n", i, p.URL, p.AdminURL)
	}
	fmt.Printf("   try: curl -s %s/v1/chat/completions -H 'Authorization: Bearer sk-demo-alice' -d '{\"model\":\"demo\",\"max_tokens\":100}'\n", proxies[0].URL)
	fmt.Printf("   the admin API takes a bearer token allowed by ClusterRole tokenwarden-proxy-admin-reader:\n"+
		"   curl -s %s/admin/effective -H 'Authorization: Bearer %s'\n", proxies[0].AdminURL, s.AdminToken)
	fmt.Printf("   after a kubectl apply, a proxy enforces it once the \"generation\" of its /admin/effective reaches the\n"+
		"   annotation tokenwarden.io/config-generation of ConfigMap %s/fleet-proxy; the control plane tells it from the\n"+
		"   proxies' reports: kubectl wait -n %s tp/fleet --for=condition=Enforced\n", ns, ns)
	<-ctx.Done()
	fmt.Println("\nStopping.")
	return nil
}
