// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package controllers_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	twv1alpha1 "github.com/tokenwarden/tokenwarden/api/v1alpha1"
	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/proxy/config"
	"github.com/tokenwarden/tokenwarden/proxy/metrics"
	"github.com/tokenwarden/tokenwarden/proxy/report"
	"github.com/tokenwarden/tokenwarden/proxy/server"
	"github.com/tokenwarden/tokenwarden/proxy/source"
	"github.com/tokenwarden/tokenwarden/test/fakellm"
	"github.com/tokenwarden/tokenwarden/test/fleetwait"
)

// usageInterval is the suite's shortest time between two writes of a budget's usage;
// reportEvery is how often the specs' proxy reports (15 s each in a cluster). A report
// counts the refusals of its last four scans (1 s here): several write intervals, as
// in a cluster, so that a loaded machine is slow rather than wrong.
const (
	usageInterval = 200 * time.Millisecond
	reportEvery   = 250 * time.Millisecond
)

// usageProxy runs one replica of the fleet in this process, exactly as a pod runs it
// but for its intervals: its config from the fleet's ConfigMap through the API server,
// and its report Lease with its usage report. It returns the proxy's URL.
func usageProxy(ns string) string {
	GinkgoHelper()
	backend := fakellm.New()
	backend.Set(fakellm.Behaviour{InputTokens: 500, OutputTokens: 1000})
	be := httptest.NewServer(backend)
	DeferCleanup(be.Close)
	tp := fleetProxy(ns, 1)
	tp.Spec.Upstreams = tp.Spec.Upstreams[1:]
	tp.Spec.Upstreams[0].URL = be.URL
	Expect(k8sClient.Create(ctx, tp)).To(Succeed())
	_, err := fleetwait.Wait(ctx, k8sClient, ns, "fleet", nil, enforceTimeout)
	Expect(err).NotTo(HaveOccurred())

	cs, err := kubernetes.NewForConfig(cfg)
	Expect(err).NotTo(HaveOccurred())
	src := &source.ConfigMap{Client: cs, Namespace: ns, Name: "fleet-proxy", Key: "proxy.yaml"}
	logger := slog.New(slog.NewTextHandler(GinkgoWriter, nil))
	mem := budget.NewMemory(budget.SystemClock{}, 1000)
	refusals := &report.Refusals{}
	srv := server.New(server.Options{Store: mem, Memory: mem, Metrics: metrics.New(prometheus.NewRegistry()), Logger: logger, Refusals: refusals})
	summarizer := &report.Summarizer{Levels: mem, Refusals: refusals, Every: reportEvery}
	lease := &report.Lease{Client: cs, Namespace: ns, ConfigMap: "fleet-proxy", Replica: "fleet-proxy-0", Log: logger,
		Renew: reportEvery, UsageEvery: reportEvery, Usage: func(ctx context.Context) (string, error) {
			u, err := summarizer.Summary(ctx)
			if err != nil {
				return "", err
			}
			return u.Encode(), nil
		}}
	apply := func(data []byte, origin string) error {
		c, err := srv.Apply(data, origin)
		if err == nil {
			lease.Applied(c.Generation, config.Digest(data))
		}
		return err
	}
	data, err := src.Load(ctx)
	Expect(err).NotTo(HaveOccurred())
	Expect(apply(data, src.String())).To(Succeed())
	pctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); lease.Run(pctx) }()
	go func() { _ = src.Run(pctx, apply) }()
	DeferCleanup(func() { stop(); <-done })
	front := httptest.NewServer(srv)
	DeferCleanup(front.Close)
	return front.URL
}

// chat sends one chat completion with a key and returns the status.
func chat(url, key, model string) int {
	GinkgoHelper()
	req, _ := http.NewRequest("POST", url+"/v1/chat/completions", strings.NewReader(`{"model":"`+model+`","max_tokens":1000}`))
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	Expect(err).NotTo(HaveOccurred())
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// getColumns reads one budget's row of `kubectl get tokenbudgets -o wide`, by header.
func getColumns(g Gomega, ns, name string) map[string]string {
	rows := table(kubectl("get", "tokenbudgets", "-n", ns, "-o", "wide"))
	cols := map[string]string{}
	for _, row := range rows[1:] {
		if len(row) > 0 && row[0] == name {
			for i, h := range rows[0] {
				cols[h] = ""
				if i < len(row) {
					cols[h] = row[i]
				}
			}
		}
	}
	g.Expect(cols).NotTo(BeEmpty(), "no row %s in %v", name, rows)
	return cols
}

// leaseOf reads a Lease.
func leaseOf(g Gomega, ns, name string) *coordinationv1.Lease {
	var le coordinationv1.Lease
	g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &le)).To(Succeed())
	return &le
}

var _ = Describe("Live usage", func() {
	It("shows in kubectl get how much of each budget the fleet uses and who is at the limit, and in describe the refusals", func() {
		ns := newNamespace("usage")
		for _, k := range []string{"alice", "bob"} {
			Expect(k8sClient.Create(ctx, keySecret(ns, k, "sk-"+k))).To(Succeed())
			Expect(k8sClient.Create(ctx, apiKey(ns, k, k, k, "research"))).To(Succeed())
		}
		// Day budgets: their refill (a few tokens a second) moves no figure while the
		// spec reads them.
		Expect(k8sClient.Create(ctx, tokenBudget(ns, "per-key", twv1alpha1.DimensionPerAPIKey, "", 0, 3000))).To(Succeed())
		Expect(k8sClient.Create(ctx, tokenBudget(ns, "global", twv1alpha1.DimensionGlobal, "", 0, 10000))).To(Succeed())
		url := usageProxy(ns)

		// Each answer reports 1,500 tokens: alice's third request finds her day spent.
		Expect(chat(url, "sk-alice", "m")).To(Equal(200))
		Expect(chat(url, "sk-alice", "m")).To(Equal(200))
		Expect(chat(url, "sk-alice", "m")).To(Equal(429))
		Expect(chat(url, "sk-alice", "m")).To(Equal(429))
		Expect(chat(url, "sk-bob", "m")).To(Equal(200))

		Eventually(func(g Gomega) {
			pk := getColumns(g, ns, "per-key")
			g.Expect(pk).To(HaveKeyWithValue("USED", "100%"), "alice used all of her day")
			g.Expect(pk).To(HaveKeyWithValue("AT LIMIT", "1"))
			g.Expect(pk).To(HaveKeyWithValue("TOP CONSUMER", "alice"))
			gl := getColumns(g, ns, "global")
			g.Expect(gl).To(HaveKeyWithValue("USED", "45%"), "4,500 of 10,000 tokens of the fleet's day")
			g.Expect(gl).To(HaveKeyWithValue("AT LIMIT", ""), "one bucket: no subjects")
		}, enforceTimeout).Should(Succeed())

		// describe: the refusals by period over the last interval (four reports),
		// while alice keeps asking.
		Eventually(func(g Gomega) {
			g.Expect(chat(url, "sk-alice", "m")).To(Equal(429))
			out := kubectl("describe", "tokenbudget", "per-key", "-n", ns)
			g.Expect(out).To(MatchRegexp(`(?s)Usage:.*Refusals:\s+Day:\s+[1-9][0-9]*\s+Interval Seconds:\s+1\s+Minute:\s+0\s+Requests:\s+0\s+Subjects At Limit:\s+1\s+Top Consumer:\s+alice\s`))
		}, enforceTimeout).Should(Succeed())

		// The refusals were counted over one report's interval: the next report has
		// none, and the status says so.
		Eventually(func(g Gomega) {
			g.Expect(budgetStatus(g, ns, "per-key").Usage.Refusals.Day).To(BeZero())
		}, enforceTimeout).Should(Succeed())
	})

	It("writes no TokenBudget status while the fleet's use does not change meaningfully", func() {
		ns := newNamespace("usage-idle")
		Expect(k8sClient.Create(ctx, keySecret(ns, "alice", "sk-alice"))).To(Succeed())
		Expect(k8sClient.Create(ctx, apiKey(ns, "alice", "alice", "alice", "research"))).To(Succeed())
		Expect(k8sClient.Create(ctx, tokenBudget(ns, "global", twv1alpha1.DimensionGlobal, "", 0, 10000))).To(Succeed())
		Expect(k8sClient.Create(ctx, tokenBudget(ns, "sonnet", twv1alpha1.DimensionPerModel, "claude-sonnet", 60000, 0))).To(Succeed())
		url := usageProxy(ns)
		Expect(chat(url, "sk-alice", "m")).To(Equal(200))

		var used, idle twv1alpha1.TokenBudget
		Eventually(func(g Gomega) {
			g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: "global"}, &used)).To(Succeed())
			g.Expect(used.Status.Usage).NotTo(BeNil())
			g.Expect(used.Status.Usage.Used).To(Equal("15%"))
			g.Expect(condition(used.Status.Conditions, twv1alpha1.ConditionEnforced).Status).To(Equal(metav1.ConditionTrue))
			g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: "sonnet"}, &idle)).To(Succeed())
			g.Expect(condition(idle.Status.Conditions, twv1alpha1.ConditionEnforced).Status).To(Equal(metav1.ConditionTrue))
		}, enforceTimeout).Should(Succeed())

		// Ten reports and more than three write intervals: the replica renews its
		// Lease with each (its use refills a little all the time), and no budget's
		// status changes.
		renewals := map[time.Time]bool{}
		Eventually(func(g Gomega) {
			le := leaseOf(g, ns, "fleet-proxy-fleet-proxy-0")
			renewals[le.Spec.RenewTime.Time] = true
			g.Expect(len(renewals)).To(BeNumerically(">=", 10))
		}, enforceTimeout, reportEvery/4).Should(Succeed())
		Expect(time.Duration(len(renewals)) * reportEvery).To(BeNumerically(">", 3*usageInterval))

		var after twv1alpha1.TokenBudget
		Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: "global"}, &after)).To(Succeed())
		Expect(after.ResourceVersion).To(Equal(used.ResourceVersion), "the used budget's status was rewritten: %+v", after.Status.Usage)
		Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: "sonnet"}, &after)).To(Succeed())
		Expect(after.ResourceVersion).To(Equal(idle.ResourceVersion), "the idle budget's status was rewritten: %+v", after.Status.Usage)
		Expect(after.Status.Usage).To(BeNil(), "an unused budget shows no usage")
	})
})
