// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/tokenwarden/tokenwarden/test/stack"
)

// cacheStory turns the response cache on for the fleet and sends alice's request
// twice: the second is a hit, answered without the backend, and charges nothing.
func cacheStory(ctx context.Context, st *story, s *stack.Stack, proxies []*stack.Proxy) error {
	st.step(7, "The response cache: an identical request is answered without the backend and costs nothing")
	if _, err := s.Kubectl("patch", "tp/fleet", "-n", ns, "--type=merge", "-p", `{"spec":{"cache":{"storage":"Memory"}}}`); err != nil {
		return err
	}
	say(`kubectl patch tp/fleet --type=merge -p '{"spec":{"cache":{"storage":"Memory"}}}'`)
	if _, err := s.WaitEnforced(ctx, ns, "fleet", enforceTimeout); err != nil {
		st.check(false, fmt.Sprintf("every proxy applies the cache: %v", err))
		return nil
	}
	p := proxies[0]
	usage := func() float64 { return metricSum(p.AdminURL, "tokenwarden_api_key_usage_tokens_total", `alice"`) }
	before := usage()
	miss, err := chat(p.URL, "sk-demo-alice", 400)
	if err != nil {
		return err
	}
	say("alice → POST /v1/chat/completions: %d, x-tokenwarden-cache: %s", miss.code, miss.header.Get("X-Tokenwarden-Cache"))
	charged := waitFor(func() bool { return usage() >= before+1500 })
	st.check(miss.code == 200 && miss.header.Get("X-Tokenwarden-Cache") == "miss" && charged,
		fmt.Sprintf("the first is a miss: it went to the backend and charged alice %.0f tokens", usage()-before))

	after := usage()
	hit, err := chat(p.URL, "sk-demo-alice", 400)
	if err != nil {
		return err
	}
	say("the same request again: %d, x-tokenwarden-cache: %s, age: %s s", hit.code, hit.header.Get("X-Tokenwarden-Cache"), hit.header.Get("Age"))
	counted := waitFor(func() bool { return metricSum(p.AdminURL, "tokenwarden_cache_requests_total", `result="hit"`) >= 1 })
	st.check(hit.code == 200 && hit.header.Get("X-Tokenwarden-Cache") == "hit" && counted, "the second is a hit, answered from the cache")
	st.check(usage() == after, fmt.Sprintf("the hit charged nothing: alice's usage stays at %.0f tokens", after))
	excerpt(p.AdminURL, func(line string) bool {
		return strings.HasPrefix(line, "tokenwarden_cache_requests_total") || strings.HasPrefix(line, "tokenwarden_cache_saved_tokens_total")
	})
	return nil
}

// waitFor polls ok until it holds or enforceTimeout passes.
func waitFor(ok func() bool) bool {
	deadline := time.Now().Add(enforceTimeout)
	for !ok() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(50 * time.Millisecond)
	}
	return true
}

// metricSum sums the samples of the metric name whose labels contain labels, from a
// proxy's /metrics.
func metricSum(adminURL, name, labels string) float64 {
	resp, err := http.Get(adminURL + "/metrics")
	if err != nil {
		return -1
	}
	defer func() { _ = resp.Body.Close() }()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	sum := 0.0
	for sc.Scan() {
		line := sc.Text()
		rest, ok := strings.CutPrefix(line, name)
		if !ok || (rest != "" && rest[0] != '{' && rest[0] != ' ') || !strings.Contains(rest, labels) {
			continue
		}
		if v, err := strconv.ParseFloat(rest[strings.LastIndexByte(rest, ' ')+1:], 64); err == nil {
			sum += v
		}
	}
	return sum
}
