// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/tokenwarden/tokenwarden/test/stack"
)

// pluginStory ends the story with the kubectl plugin: who is near their limit, why
// the batch job was refused, and what applies to alice.
func pluginStory(st *story, s *stack.Stack, o options, proxies []*stack.Proxy) {
	st.step(9, "kubectl tokenwarden: who is near a limit, why the batch job was refused, what applies to alice")
	// The batch job runs again until refused: the replicas report their use within a
	// usage interval, and the operator writes it into the budgets' status, which top
	// reads. Each of its requests is another (the response cache is on since step 7,
	// and would answer a repeated one for nothing).
	p0 := proxies[0].URL
	for i := 1; i <= 4; i++ {
		b, err := chat(p0, "sk-demo-batch", 1000+i)
		if err != nil {
			break
		}
		say("batch call %d: %d", i, b.code)
		if b.code == 429 {
			break
		}
	}
	var out string
	var err error
	deadline := time.Now().Add(enforceTimeout)
	for {
		out, err = plugin(s, o, "top", "-n", ns)
		if (err == nil && strings.Contains(out, "batch")) || time.Now().After(deadline) {
			break
		}
		time.Sleep(2 * time.Second)
	}
	say("kubectl tokenwarden top -n %s", ns)
	indent(out)
	st.check(err == nil && strings.Contains(out, "batch"), "top ranks the namespace's keys by the tightest budget each uses: the batch job first")

	// The proxies here are processes, not pods: the plugin reaches their admin API at
	// its address, with the token of a ServiceAccount bound to the admin reader role
	// (the demo's kubeconfig holds a client certificate, which a replica cannot check).
	addrs := make([]string, 0, len(proxies))
	for _, p := range proxies {
		addrs = append(addrs, p.AdminURL)
	}
	reach := []string{"--admin-addr", strings.Join(addrs, ","), "--admin-token", s.AdminToken}
	out, err = plugin(s, o, append([]string{"why", "batch", "-n", ns}, reach...)...)
	say("kubectl tokenwarden why batch -n %s --admin-addr ... --admin-token ...", ns)
	indent(out)
	st.check(err == nil && strings.Contains(out, "api_key tokens") && strings.Contains(out, "minute"),
		"why batch: its own minute budget refused it, what it asked, what was left and its Retry-After, from every replica's audit")

	// alice sends a request just before: a minute budget refills within seconds.
	if a, err := chat(p0, "sk-demo-alice", 500); err == nil {
		say("alice → %d", a.code)
	}
	out, err = plugin(s, o, append([]string{"explain", "alice", "--model", "demo", "-n", ns}, reach...)...)
	say("kubectl tokenwarden explain alice --model demo -n %s --admin-addr ... --admin-token ...", ns)
	indent(out)
	st.check(err == nil && strings.Contains(out, "limits per_api_key") && strings.Contains(out, "7500") && strings.Contains(out, "Tightest now: #1 "),
		"explain alice: every budget that applies to her, in reservation order, 1/4 of each per replica, her minute budget the tightest")
}

// spendStory shows the Redis fleet's spend, from its ledger: what carol spent, in
// dollars, equal on both replicas since they share one PostgreSQL.
func spendStory(st *story, s *stack.Stack, o options, proxies []*stack.Proxy, ledgerURL string) {
	st.step(8, "kubectl tokenwarden spend: what the Redis fleet spent, from its ledger")
	if len(proxies) == 0 || ledgerURL == "" {
		say("Skipped: this step needs the Redis fleet and PostgreSQL (Debian's redis-server and postgresql packages).")
		return
	}
	var out string
	var err error
	deadline := time.Now().Add(enforceTimeout)
	for {
		// The replica that did not serve the $20 job reports it: the record is the fleet's.
		out, err = plugin(s, o, "spend", "--by", "key", "-n", ns, "--admin-addr", proxies[1].AdminURL, "--admin-token", s.AdminToken)
		if (err == nil && strings.Contains(out, " 20.0")) || time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Second)
	}
	say("kubectl tokenwarden spend --by key -n %s --admin-addr <proxy 1> --admin-token ...", ns)
	indent(out)
	st.check(err == nil && strings.Contains(out, "carol") && strings.Contains(out, " 20.0"),
		"spend: carol's requests, tokens and dollars ($20 and change), recorded by both replicas in one PostgreSQL and reported by either")
}

// plugin runs `kubectl tokenwarden ARGS` with the plugin on PATH and the stack's
// kubeconfig (kubectl passes no flag written before a plugin's name).
func plugin(s *stack.Stack, o options, args ...string) (string, error) {
	dir := o.PluginDir
	if dir == "" {
		dir = filepath.Join(o.Root, "bin")
	}
	cmd := exec.Command(filepath.Join(o.Root, "bin", "kubectl"), append([]string{"tokenwarden"}, args...)...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+s.Kubeconfig, "PATH="+dir+string(os.PathListSeparator)+os.Getenv("PATH"))
	out, err := cmd.CombinedOutput()
	return string(out), err
}
