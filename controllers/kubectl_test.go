// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package controllers_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	twv1alpha1 "github.com/tokenwarden/tokenwarden/api/v1alpha1"
	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/proxy/metrics"
	"github.com/tokenwarden/tokenwarden/proxy/server"
	"github.com/tokenwarden/tokenwarden/proxy/source"
	"github.com/tokenwarden/tokenwarden/test/fakellm"
	"github.com/tokenwarden/tokenwarden/test/fleetwait"
)

// enforceTimeout bounds each wait for a proxy to hold a change: generous, so that a
// loaded machine is slow rather than wrong. The time taken is reported, not bounded.
const enforceTimeout = time.Minute

// kubectl runs the real kubectl from bin/ against the test API server.
func kubectl(args ...string) string {
	GinkgoHelper()
	user, err := testEnv.AddUser(envtest.User{Name: "admin", Groups: []string{"system:masters"}}, cfg)
	Expect(err).NotTo(HaveOccurred())
	kc, err := user.KubeConfig()
	Expect(err).NotTo(HaveOccurred())
	path := filepath.Join(GinkgoT().TempDir(), "kubeconfig")
	Expect(os.WriteFile(path, kc, 0o600)).To(Succeed())
	cmd := exec.Command(filepath.Join(os.Getenv("KUBEBUILDER_ASSETS"), "kubectl"), append([]string{"--kubeconfig", path}, args...)...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	Expect(cmd.Run()).To(Succeed(), "kubectl %s: %s", strings.Join(args, " "), errOut.String())
	return out.String()
}

var _ = Describe("kubectl", func() {
	It("shows each replica's allowance in get, and scales a fleet through the scale subresource", func() {
		ns := newNamespace("kubectl")
		Expect(k8sClient.Create(ctx, keySecret(ns, "alice", "sk-alice"))).To(Succeed())
		Expect(k8sClient.Create(ctx, apiKey(ns, "alice", "alice", "alice", "research"))).To(Succeed())
		Expect(k8sClient.Create(ctx, tokenBudget(ns, "team", twv1alpha1.DimensionPerTeam, "", 120000, 2400000))).To(Succeed())
		Expect(k8sClient.Create(ctx, tokenBudget(ns, "sonnet", twv1alpha1.DimensionPerModel, "claude-sonnet", 60000, 0))).To(Succeed())
		Expect(k8sClient.Create(ctx, fleetProxy(ns, 3))).To(Succeed())
		Eventually(func(g Gomega) {
			g.Expect(budgetStatus(g, ns, "sonnet").Replicas).To(Equal(int64(3)))
			g.Expect(budgetStatus(g, ns, "team").Replicas).To(Equal(int64(3)))
		}).Should(Succeed())

		// The fleet's status is written right after the budgets': read until it shows.
		Eventually(func(g Gomega) {
			rows := table(kubectl("get", "tokenbudgets", "-n", ns))
			g.Expect(rows[0]).To(Equal([]string{"NAME", "DIMENSION", "SUBJECTS", "APPLIES WHEN", "COUNT BY", "AMOUNT", "WINDOWS", "ACTION", "REPLICAS", "PER-REPLICA", "READY", "USED", "AT LIMIT", "SPENT", "PROJECTED", "AGE"}))
			g.Expect(rows[1][:11]).To(Equal([]string{"sonnet", "PerModel", "claude-sonnet", "", "", "tokens", "60k/min", "Block", "3", "20k/min", "True"}))
			g.Expect(rows[2][:11]).To(Equal([]string{"team", "PerTeam", "each team", "", "", "tokens", "120k/min, 2.4M/day", "Block", "3", "40k/min, 800k/day", "True"}))
			// The limits shape's columns and a calendar window's run-out and reset times
			// stay in the wide output; an unlimited period (PER-REPLICA TPD of a budget
			// without tokensPerDay) prints empty.
			wide := table(kubectl("get", "tokenbudgets", "-n", ns, "-o", "wide"))
			g.Expect(wide[0][16:]).To(Equal([]string{"TOP CONSUMER", "RUNS OUT", "RESETS", "MODEL", "TPM", "TPD", "PER-REPLICA TPM", "PER-REPLICA TPD"}))
			g.Expect(wide[1][16:]).To(Equal([]string{"", "", "", "claude-sonnet", "60000", "0", "20000"}))
			g.Expect(wide[2][16:]).To(Equal([]string{"", "", "", "", "120000", "2400000", "40000", "800000"}))

			var out string

			out = kubectl("get", "tp", "-n", ns)
			g.Expect(strings.Fields(strings.Split(out, "\n")[0])).To(Equal([]string{"NAME", "REPLICAS", "READY", "STORAGE", "BUDGETS", "KEYS", "ENFORCED", "UPSTREAMS", "OUT", "AGE"}))
			g.Expect(strings.Fields(strings.Split(out, "\n")[1])[:7]).To(Equal([]string{"fleet", "3", "0", "Memory", "2", "1", "0/0"}),
				"no pod runs in the test control plane, and no replica reports")

			out = kubectl("get", "ak", "-n", ns)
			g.Expect(strings.Fields(strings.Split(out, "\n")[1])[:5]).To(Equal([]string{"alice", "alice", "research", sha("sk-alice")[:8], "True"}))
		}).Should(Succeed())

		kubectl("scale", "tp/fleet", "-n", ns, "--replicas=5")
		Eventually(func(g Gomega) {
			g.Expect(budgetStatus(g, ns, "team").PerReplica.TokensPerMinute).To(HaveValue(Equal(int64(24000))))
		}).Should(Succeed())
		Expect(kubectl("get", "tb", "team", "-n", ns, "-o", "jsonpath={.status.perReplica.tokensPerMinute}")).To(Equal("24000"))
	})
})

var _ = Describe("A proxy watching its ConfigMap", func() {
	It("enforces a changed TokenBudget once it applies the generation that holds it, and reports how long that took", func() {
		ns := newNamespace("watch")
		Expect(k8sClient.Create(ctx, keySecret(ns, "alice", "sk-alice"))).To(Succeed())
		Expect(k8sClient.Create(ctx, apiKey(ns, "alice", "alice", "alice", "research"))).To(Succeed())
		Expect(k8sClient.Create(ctx, tokenBudget(ns, "per-key", twv1alpha1.DimensionPerAPIKey, "", 100000, 0))).To(Succeed())
		tp := fleetProxy(ns, 1)
		tp.Spec.Upstreams = tp.Spec.Upstreams[1:]
		backend := httptest.NewServer(fakellm.New())
		DeferCleanup(backend.Close)
		tp.Spec.Upstreams[0].URL = backend.URL
		Expect(k8sClient.Create(ctx, tp)).To(Succeed())
		// The operator has rendered the key and the budget: the ConfigMap holds them.
		_, err := fleetwait.Wait(ctx, k8sClient, ns, "fleet", nil, enforceTimeout)
		Expect(err).NotTo(HaveOccurred())

		// The proxy, exactly as a pod runs it: a ConfigMap source through the API server.
		cs, err := kubernetes.NewForConfig(cfg)
		Expect(err).NotTo(HaveOccurred())
		src := &source.ConfigMap{Client: cs, Namespace: ns, Name: "fleet-proxy", Key: "proxy.yaml"}
		data, err := src.Load(ctx)
		Expect(err).NotTo(HaveOccurred())
		Expect(rendered(Default, ns).APIKeys).To(HaveLen(1))
		logger := slog.New(slog.NewTextHandler(GinkgoWriter, nil))
		mem := budget.NewMemory(budget.SystemClock{}, 1000)
		srv := server.New(server.Options{Store: mem, Memory: mem, Metrics: metrics.New(prometheus.NewRegistry()), Logger: logger})
		_, err = srv.Apply(data, src.String())
		Expect(err).NotTo(HaveOccurred())
		go func() {
			_ = src.Run(ctx, func(d []byte, origin string) error { _, err := srv.Apply(d, origin); return err })
		}()
		front := httptest.NewServer(srv)
		DeferCleanup(front.Close)
		// The proxy as fleetwait reads it: the generation of the config it applied.
		proxy := []fleetwait.Replica{{Name: "the in-process proxy", Generation: func(context.Context) (int64, error) {
			e, ok := srv.Effective()
			if !ok {
				return 0, errors.New("no config loaded yet")
			}
			return e.Generation, nil
		}}}
		before, err := fleetwait.Wait(ctx, k8sClient, ns, "fleet", proxy, enforceTimeout)
		Expect(err).NotTo(HaveOccurred())

		chat := func() int {
			req, _ := http.NewRequest("POST", front.URL+"/v1/chat/completions", strings.NewReader(`{"model":"m","max_tokens":1000}`))
			req.Header.Set("Authorization", "Bearer sk-alice")
			resp, err := http.DefaultClient.Do(req)
			Expect(err).NotTo(HaveOccurred())
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			return resp.StatusCode
		}
		Expect(chat()).To(Equal(200))

		var b twv1alpha1.TokenBudget
		Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: "per-key"}, &b)).To(Succeed())
		patch := client.MergeFrom(b.DeepCopy())
		b.Spec.TokensPerMinute = 500 // smaller than one request
		patched := time.Now()
		Expect(k8sClient.Patch(ctx, &b, patch)).To(Succeed())
		after, err := fleetwait.Wait(ctx, k8sClient, ns, "fleet", proxy, enforceTimeout)
		Expect(err).NotTo(HaveOccurred())
		Expect(after).To(BeNumerically(">", before), "the edit is a new generation of the config")
		applied := time.Since(patched)
		// The proxy holds the edit: Eventually only keeps a loaded machine from failing.
		Eventually(chat, enforceTimeout, 20*time.Millisecond).Should(Equal(429))
		refused := time.Since(patched)
		AddReportEntry("TokenBudget edit to a proxy watching its ConfigMap", fmt.Sprintf("generation %d applied %v after the patch; refusing after %v",
			after, applied.Round(time.Millisecond), refused.Round(time.Millisecond)))
		GinkgoWriter.Printf("A TokenBudget edit: generation %d applied %v after the patch, enforced %v after it\n", after, applied, refused)
	})
})
