// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package controllers_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	twv1alpha1 "github.com/tokenwarden/tokenwarden/api/v1alpha1"
	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/proxy/budget/redisstore"
	"github.com/tokenwarden/tokenwarden/proxy/config"
	"github.com/tokenwarden/tokenwarden/proxy/metrics"
	"github.com/tokenwarden/tokenwarden/proxy/report"
	"github.com/tokenwarden/tokenwarden/proxy/server"
	"github.com/tokenwarden/tokenwarden/proxy/source"
	"github.com/tokenwarden/tokenwarden/test/fakellm"
	"github.com/tokenwarden/tokenwarden/test/redisserver"
)

var _ = Describe("The trust fence of a fleet's durable budgets", func() {
	It("records the fleet's epoch, shows a fence after Redis lost its data, and lifts it on the attested epoch", func() {
		rs := redisserver.Start(GinkgoT())
		ns := newNamespace("fence")
		Expect(k8sClient.Create(ctx, keySecret(ns, "alice", "sk-alice"))).To(Succeed())
		Expect(k8sClient.Create(ctx, apiKey(ns, "alice", "alice", "alice", "research"))).To(Succeed())
		Expect(k8sClient.Create(ctx, ruleBudget(ns, "monthly-requests", twv1alpha1.DimensionPerAPIKey, func(s *twv1alpha1.TokenBudgetSpec) {
			s.Amount = twv1alpha1.AmountRequests
			s.Windows = windows(calendarWindow("1000", twv1alpha1.CalendarWindow{Every: twv1alpha1.EveryMonth}))
		}))).To(Succeed())
		tp := redisFleet(ns, 1)
		tp.Spec.Storage.Redis.URL = rs.URL()
		tp.Spec.Upstreams = tp.Spec.Upstreams[1:]
		backend := httptest.NewServer(fakellm.New())
		DeferCleanup(backend.Close)
		tp.Spec.Upstreams[0].URL = backend.URL
		Expect(k8sClient.Create(ctx, tp)).To(Succeed())
		var first *config.Config
		Eventually(func(g Gomega) {
			first = rendered(g, ns)
			g.Expect(first.RateLimiting.Rules).NotTo(BeEmpty())
		}, enforceTimeout).Should(Succeed())
		Expect(first.RateLimiting.Redis.Epoch).To(BeEmpty(), "a brand-new fleet has no epoch yet")

		// One replica, as a pod runs it: the ConfigMap source, the Redis store, the
		// report Lease.
		pctx, stop := context.WithCancel(ctx)
		cs, err := kubernetes.NewForConfig(cfg)
		Expect(err).NotTo(HaveOccurred())
		logger := slog.New(slog.NewTextHandler(GinkgoWriter, nil))
		lease := &report.Lease{Client: cs, Namespace: ns, ConfigMap: "fleet-proxy", Replica: "r1", Log: logger}
		m := metrics.New(prometheus.NewRegistry())
		store, err := redisstore.New(redisstore.Options{URL: rs.URL(), Prefix: first.RateLimiting.Redis.KeyPrefix,
			Recorder: m, Logger: logger, EpochChanged: lease.Changed})
		Expect(err).NotTo(HaveOccurred())
		lease.Epochs = func() string { b, _ := json.Marshal(store.Epochs()); return string(b) }
		mem := budget.NewMemory(budget.SystemClock{}, 1000)
		srv := server.New(server.Options{Store: store, Memory: mem, Metrics: m, Logger: logger, AsyncSettle: true})
		src := &source.ConfigMap{Client: cs, Namespace: ns, Name: "fleet-proxy", Key: "proxy.yaml"}
		apply := func(d []byte, origin string) error {
			c, err := srv.Apply(d, origin)
			if err == nil {
				lease.Applied(c.Generation, config.Digest(d))
			}
			return err
		}
		data, err := src.Load(ctx)
		Expect(err).NotTo(HaveOccurred())
		Expect(apply(data, src.String())).To(Succeed())
		leaseDone := make(chan struct{})
		go func() { defer close(leaseDone); lease.Run(pctx) }()
		go func() { _ = src.Run(pctx, apply) }()
		DeferCleanup(func() { stop(); <-leaseDone; _ = store.Close() })
		front := httptest.NewServer(srv)
		DeferCleanup(front.Close)
		admin := httptest.NewServer(srv.AdminHandler(prometheus.NewRegistry()))
		DeferCleanup(admin.Close)
		chat := func() int {
			req, _ := http.NewRequest("POST", front.URL+"/v1/chat/completions", strings.NewReader(`{"model":"gpt-4o","max_tokens":10}`))
			req.Header.Set("Authorization", "Bearer sk-alice")
			resp, err := http.DefaultClient.Do(req)
			Expect(err).NotTo(HaveOccurred())
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			return resp.StatusCode
		}
		recorded := func(g Gomega) string {
			eps := proxyStatus(g, ns).DurableEpochs
			g.Expect(eps).To(HaveLen(1))
			g.Expect(eps[0].Group).To(Equal(ns + "/fleet"))
			return eps[0].Epoch
		}

		Expect(chat()).To(Equal(200), "the first durable admission creates the epoch")
		epoch := store.Epochs()[0].Epoch
		Eventually(recorded, enforceTimeout).Should(Equal(epoch), "the operator records the reported epoch")
		Eventually(func(g Gomega) string { return rendered(g, ns).RateLimiting.Redis.Epoch }, enforceTimeout).Should(Equal(epoch))
		Eventually(func(g Gomega) {
			g.Expect(verdictOf(proxyStatus(g, ns).Conditions, twv1alpha1.ConditionDurableBudgetsFenced).Status).To(BeEquivalentTo("False"))
		}, enforceTimeout).Should(Succeed())

		Expect(rs.Restart()).To(Succeed()) // no persistence: the counters and the epoch are gone
		Eventually(chat, enforceTimeout).Should(Equal(503))
		Eventually(func(g Gomega) {
			v := verdictOf(proxyStatus(g, ns).Conditions, twv1alpha1.ConditionDurableBudgetsFenced)
			g.Expect(v.Status).To(BeEquivalentTo("True"))
			g.Expect(v.Reason).To(Equal(twv1alpha1.ReasonCounterStateLost))
			g.Expect(v.Message).To(ContainSubstring("Replicas r1: Redis holds no epoch, not the epoch " + epoch))
			g.Expect(v.Message).To(ContainSubstring("POST /admin/durable/attest"))
		}, enforceTimeout).Should(Succeed())
		Expect(recorded(Default)).To(Equal(epoch), "a fence records nothing")

		resp, err := http.Post(admin.URL+"/admin/durable/attest", "application/json", strings.NewReader(`{"mode":"adopt"}`))
		Expect(err).NotTo(HaveOccurred())
		var out struct{ Epoch string }
		Expect(json.NewDecoder(resp.Body).Decode(&out)).To(Succeed())
		resp.Body.Close()
		Expect(resp.StatusCode).To(Equal(200))
		Expect(out.Epoch).NotTo(Equal(epoch))
		Eventually(recorded, enforceTimeout).Should(Equal(out.Epoch), "the operator records the attested epoch")
		Eventually(func(g Gomega) string { return rendered(g, ns).RateLimiting.Redis.Epoch }, enforceTimeout).Should(Equal(out.Epoch))
		Eventually(func(g Gomega) {
			g.Expect(verdictOf(proxyStatus(g, ns).Conditions, twv1alpha1.ConditionDurableBudgetsFenced).Status).To(BeEquivalentTo("False"))
		}, enforceTimeout).Should(Succeed())
		Expect(chat()).To(Equal(200))

		By("a forged report of an epoch from the far future, and a fenced one")
		for name, epochs := range map[string]string{
			"fleet-proxy-forged": `[{"group":"` + ns + `/fleet","epoch":"9999999999999-ff"}]`,
			"fleet-proxy-fenced": `[{"group":"` + ns + `/fleet","epoch":"` + strconv.FormatInt(time.Now().UnixMilli(), 10) + `-ee","fenced":true}]`,
		} {
			now := metav1.NewMicroTime(time.Now())
			Expect(k8sClient.Create(ctx, &coordinationv1.Lease{
				ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns,
					Labels: map[string]string{twv1alpha1.ReplicaConfigMapLabel: "fleet-proxy"},
					Annotations: map[string]string{twv1alpha1.ReplicaGenerationAnnotation: "1", twv1alpha1.ReplicaDigestAnnotation: "x",
						twv1alpha1.ReplicaDurableEpochsAnnotation: epochs}},
				Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(name), LeaseDurationSeconds: ptr.To(int32(600)), RenewTime: &now},
			})).To(Succeed())
		}
		Eventually(func(g Gomega) int32 { return proxyStatus(g, ns).LiveReplicas }, enforceTimeout).Should(Equal(int32(3)), "the operator has read both")
		Expect(recorded(Default)).To(Equal(out.Epoch), "neither is recorded")
	})
})
