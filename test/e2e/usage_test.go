// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"context"
	"fmt"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/tokenwarden/tokenwarden/test/fakellm"
	"github.com/tokenwarden/tokenwarden/test/redisserver"
	"github.com/tokenwarden/tokenwarden/test/stack"
)

// usageInterval is how often the suite's proxies report their usage, and the shortest
// time between two writes of a budget's usage (15 s each in a cluster).
const usageInterval = time.Second

// dayBudget is a TokenBudget with a day allowance only: its refill (a few tokens a
// second) moves no percentage while a spec reads it.
func dayBudget(name, dimension string, tpd int) string {
	return fmt.Sprintf(`
apiVersion: tokenwarden.io/v1alpha1
kind: TokenBudget
metadata: {name: %s}
spec: {proxyRef: {name: fleet}, dimension: %s, tokensPerDay: %d}
`, name, dimension, tpd)
}

// usageColumns reads USED and AT LIMIT of one budget from `kubectl get tb -o
// custom-columns`, which prints <none> for an absent field.
func usageColumns(g Gomega, ns, name string) (used, atLimit, top string) {
	out, err := st.Kubectl("get", "tb", name, "-n", ns, "--no-headers", "-o",
		"custom-columns=USED:.status.usage.used,ATLIMIT:.status.usage.subjectsAtLimit,TOP:.status.usage.topConsumer")
	g.Expect(err).NotTo(HaveOccurred())
	f := strings.Fields(out)
	g.Expect(f).To(HaveLen(3), out)
	return f[0], f[1], f[2]
}

var _ = Describe("Live usage from real proxies", func() {
	ctx := context.Background()
	// Each request settles at 1,000 tokens.
	send := func(p *stack.Proxy, key string) int {
		_, err := openaiClient(p, key, 0).Chat.Completions.New(ctx, chatParams(500))
		return statusOf(err)
	}

	It("adds up the shares of a memory fleet's replicas", func() {
		ns := namespace()
		proxies := fleet(ns, 2, "{type: Memory}", dayBudget("global", "Global", 10000), dayBudget("per-user", "PerUser", 4000))
		st.LLM.Set(fakellm.Behaviour{InputTokens: 1000, OutputTokens: 0})
		// alice on both replicas, bob on one: 3,000 of the fleet's 10,000; alice has
		// used 2,000 of her 4,000 (2,000 per replica), half.
		Expect(send(proxies[0], "sk-e2e-alice")).To(Equal(200))
		Expect(send(proxies[1], "sk-e2e-alice")).To(Equal(200))
		Expect(send(proxies[1], "sk-e2e-bob")).To(Equal(200))
		Eventually(func(g Gomega) {
			used, atLimit, _ := usageColumns(g, ns, "global")
			g.Expect(used).To(Equal("30%"))
			g.Expect(atLimit).To(Equal("<none>"))
			used, atLimit, top := usageColumns(g, ns, "per-user")
			g.Expect([]string{used, atLimit, top}).To(Equal([]string{"50%", "0", "alice"}))
		}).Should(Succeed())
	})

	It("takes the shared buckets of a Redis fleet once, not once per replica, and counts the refusals", func() {
		redis := redisserver.Start(GinkgoT())
		ns := namespace()
		proxies := fleet(ns, 2, `{type: Redis, redis: {url: "`+redis.URL()+`"}}`,
			dayBudget("global", "Global", 10000), dayBudget("per-key", "PerAPIKey", 2000))
		st.LLM.Set(fakellm.Behaviour{InputTokens: 1000, OutputTokens: 0})
		Expect(send(proxies[0], "sk-e2e-bob")).To(Equal(200))
		Expect(send(proxies[1], "sk-e2e-bob")).To(Equal(200))
		Expect(send(proxies[0], "sk-e2e-alice")).To(Equal(200))
		Eventually(func(g Gomega) {
			// bob's third request finds his 2,000 spent, on either replica.
			g.Expect(send(proxies[1], "sk-e2e-bob")).To(Equal(429))
			used, _, _ := usageColumns(g, ns, "global")
			g.Expect(used).To(Equal("30%"), "both replicas read the same 3,000 of 10,000")
			used, atLimit, top := usageColumns(g, ns, "per-key")
			g.Expect([]string{used, atLimit, top}).To(Equal([]string{"100%", "1", "bob"}))
			out, err := st.Kubectl("describe", "tb", "per-key", "-n", ns)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(out).To(MatchRegexp(`Refusals:\s+Day:\s+[1-9][0-9]*\s+Interval Seconds:\s+4\s`))
		}).Should(Succeed())
	})

	It("reads a Redis fleet's rule counters once: a team's rolling and calendar day, a key's requests", func() {
		redis := redisserver.Start(GinkgoT())
		ns := namespace()
		proxies := fleet(ns, 2, `{type: Redis, redis: {url: "`+redis.URL()+`"}}`, `
apiVersion: tokenwarden.io/v1alpha1
kind: TokenBudget
metadata: {name: team}
spec:
  proxyRef: {name: fleet}
  dimension: PerTeam
  subjects: [e2e]
  windows:
  - {limit: "10k", rolling: {period: Day}}
  - {limit: "20k", calendar: {every: Day}}
`, `
apiVersion: tokenwarden.io/v1alpha1
kind: TokenBudget
metadata: {name: requests}
spec: {proxyRef: {name: fleet}, dimension: PerAPIKey, amount: Requests, windows: [{limit: "2", rolling: {period: Day}}]}
`)
		st.LLM.Set(fakellm.Behaviour{InputTokens: 1000, OutputTokens: 0})
		Expect(send(proxies[0], "sk-e2e-bob")).To(Equal(200))
		Expect(send(proxies[1], "sk-e2e-bob")).To(Equal(200))
		Expect(send(proxies[0], "sk-e2e-alice")).To(Equal(200))
		Eventually(func(g Gomega) {
			// bob's third request finds his two requests spent, on either replica.
			g.Expect(send(proxies[1], "sk-e2e-bob")).To(Equal(429))
			used, atLimit, top := usageColumns(g, ns, "team")
			g.Expect([]string{used, atLimit, top}).To(Equal([]string{"30%", "<none>", "<none>"}),
				"both replicas read the same 3,000 of the team's 10,000 a day")
			out, err := st.Kubectl("get", "tb", "team", "-n", ns, "-o", "jsonpath={range .status.usage.windows[*]}{.window}={.used}/{.usedPercent} {end}")
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(out).To(Equal("10k/day=3k/30 20k/day=3k/15 "), "the calendar day's spend since midnight")
			used, atLimit, top = usageColumns(g, ns, "requests")
			g.Expect([]string{used, atLimit, top}).To(Equal([]string{"100%", "1", "bob"}))
			out, err = st.Kubectl("describe", "tb", "requests", "-n", ns)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(out).To(MatchRegexp(`Windows:\s+Refused:\s+[1-9][0-9]*\s`))
		}).Should(Succeed())
	})
})
