// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package controllers_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	twv1alpha1 "github.com/tokenwarden/tokenwarden/api/v1alpha1"
	"github.com/tokenwarden/tokenwarden/proxy/budget/redisstore"
	"github.com/tokenwarden/tokenwarden/proxy/metrics"
	"github.com/tokenwarden/tokenwarden/proxy/report"
	"github.com/tokenwarden/tokenwarden/test/redisserver"
)

// checkPasswordEnv is the proxy's environment variable with the check credential's
// password.
const checkPasswordEnv = "TOKENWARDEN_REDIS_CHECK_PASSWORD"

var _ = Describe("A fleet's checks of its Redis", func() {
	It("renders the checks' mode, interval and credential, whose password comes from its Secret, and a mode change rolls no pod", func() {
		ns := newNamespace("storechecks")
		tp := redisFleet(ns, 2)
		tp.Spec.Storage.Redis.StoreChecks = &twv1alpha1.RedisStoreChecks{Mode: twv1alpha1.StoreCheckEnforce, IntervalSeconds: 30,
			Username: "checker", PasswordSecretRef: &twv1alpha1.SecretKeyReference{Name: "redis-checker", Key: "password"}}
		Expect(k8sClient.Create(ctx, credentialSecret(ns, "provider", map[string]string{"anthropic": "upstream"}))).To(Succeed())
		Expect(k8sClient.Create(ctx, tp)).To(Succeed())
		Eventually(func(g Gomega) {
			v := verdictOf(proxyStatus(g, ns).Conditions, twv1alpha1.ConditionAccepted)
			g.Expect(v.Status).To(BeEquivalentTo("False"))
			g.Expect(v.Message).To(ContainSubstring("spec.storage.redis.storeChecks.passwordSecretRef"))
		}, enforceTimeout).Should(Succeed(), "a missing check credential is named")
		Expect(k8sClient.Create(ctx, credentialSecret(ns, "redis-checker", map[string]string{"password": "pw"}))).To(Succeed())
		var template corev1.PodTemplateSpec
		Eventually(func(g Gomega) {
			// The status first: it is written after the Deployment it speaks of.
			st := proxyStatus(g, ns)
			g.Expect(verdictOf(st.Conditions, twv1alpha1.ConditionAccepted).Status).To(BeEquivalentTo("True"))
			g.Expect(verdictOf(st.Conditions, twv1alpha1.ConditionDegraded).Status).To(BeEquivalentTo("False"))
			c := rendered(g, ns).RateLimiting.Redis.Checks
			g.Expect(c.Mode).To(Equal("enforce"))
			g.Expect(c.IntervalSeconds).To(Equal(int64(30)))
			g.Expect(c.Username).To(Equal("checker"))
			g.Expect(c.PasswordEnv).To(Equal(checkPasswordEnv))
			d := deployment(g, ns)
			env := map[string]*corev1.EnvVarSource{}
			for _, e := range d.Spec.Template.Spec.Containers[0].Env {
				env[e.Name] = e.ValueFrom
			}
			g.Expect(env).To(HaveKey(checkPasswordEnv))
			g.Expect(env[checkPasswordEnv].SecretKeyRef.Name).To(Equal("redis-checker"))
			g.Expect(env[checkPasswordEnv].SecretKeyRef.Key).To(Equal("password"))
			g.Expect(d.Spec.Template.Annotations).To(HaveKey(credentialsAnnotation), "the credentials the pods run with")
			template = *d.Spec.Template.DeepCopy()
		}, enforceTimeout).Should(Succeed())

		By("changing the mode, which the proxies apply on reload")
		Eventually(func() error {
			var cur twv1alpha1.TokenProxy
			if err := k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: "fleet"}, &cur); err != nil {
				return err
			}
			cur.Spec.Storage.Redis.StoreChecks.Mode = twv1alpha1.StoreCheckReport
			return k8sClient.Update(ctx, &cur)
		}).Should(Succeed())
		Eventually(func(g Gomega) string { return rendered(g, ns).RateLimiting.Redis.Checks.Mode }, enforceTimeout).Should(Equal("report"))
		var d appsv1.Deployment
		Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: "fleet-proxy"}, &d)).To(Succeed())
		Expect(d.Spec.Template.Annotations).To(Equal(template.Annotations), "the pods are not rolled")
		Expect(d.Spec.Template.Spec.Containers[0].Env).To(Equal(template.Spec.Containers[0].Env))
	})

	It("sets StoreChecksFailed from the replicas' reported checks: fenced in Enforce mode, reported in Report mode, cleared when they pass", func() {
		rs := redisserver.Start(GinkgoT())
		Expect(rs.Client().Do(ctx, "CONFIG", "SET", "maxmemory-policy", "allkeys-lru").Err()).To(Succeed())
		// The fleet's user may run no destructive command, and may run the checks.
		Expect(rs.Client().Do(ctx, "ACL", "SETUSER", "fleet", "on", ">pw", "~*", "+@all",
			"-flushall", "-flushdb", "-restore", "-debug", "-del", "-unlink").Err()).To(Succeed())
		url := strings.Replace(rs.URL(), "redis://", "redis://fleet:pw@", 1)
		ns := newNamespace("storecheckfail")
		tp := redisFleet(ns, 1)
		tp.Spec.Storage.Redis.URL = url
		tp.Spec.Storage.Redis.StoreChecks = &twv1alpha1.RedisStoreChecks{Mode: twv1alpha1.StoreCheckEnforce}
		Expect(k8sClient.Create(ctx, credentialSecret(ns, "provider", map[string]string{"anthropic": "upstream"}))).To(Succeed())
		Expect(k8sClient.Create(ctx, tp)).To(Succeed())
		var mode string
		var prefix string
		Eventually(func(g Gomega) {
			c := rendered(g, ns)
			mode, prefix = c.RateLimiting.Redis.Checks.Mode, c.RateLimiting.Redis.KeyPrefix
			g.Expect(mode).To(Equal("enforce"))
		}, enforceTimeout).Should(Succeed())

		// One replica's store and report Lease, as a pod runs them; the test runs the
		// check rounds.
		pctx, stop := context.WithCancel(ctx)
		cs, err := kubernetes.NewForConfig(cfg)
		Expect(err).NotTo(HaveOccurred())
		logger := slog.New(slog.NewTextHandler(GinkgoWriter, nil))
		lease := &report.Lease{Client: cs, Namespace: ns, ConfigMap: "fleet-proxy", Replica: "r1", Log: logger}
		store, err := redisstore.New(redisstore.Options{URL: url, Prefix: prefix, Recorder: metrics.New(prometheus.NewRegistry()),
			Logger: logger, EpochChanged: lease.Changed, Checks: redisstore.CheckOptions{Mode: mode, Interval: -1}})
		Expect(err).NotTo(HaveOccurred())
		lease.Epochs = func() string { b, _ := json.Marshal(store.Epochs()); return string(b) }
		lease.Applied(1, "digest")
		store.CheckStore(ctx)
		leaseDone := make(chan struct{})
		go func() { defer close(leaseDone); lease.Run(pctx) }()
		DeferCleanup(func() { stop(); <-leaseDone; _ = store.Close() })

		storeChecks := func(g Gomega) verdict {
			return verdictOf(proxyStatus(g, ns).Conditions, twv1alpha1.ConditionStoreChecksFailed)
		}
		Eventually(func(g Gomega) {
			v := storeChecks(g)
			g.Expect(v.Status).To(BeEquivalentTo("True"))
			g.Expect(v.Reason).To(Equal(twv1alpha1.ReasonFencedByCheck))
			g.Expect(v.Message).To(ContainSubstring("maxmemory_policy fails on replicas r1"))
			g.Expect(v.Message).To(ContainSubstring("maxmemory-policy is allkeys-lru, want noeviction"))
			g.Expect(v.Message).To(ContainSubstring("set maxmemory-policy noeviction"))
			g.Expect(v.Message).To(ContainSubstring("Replicas r1 fence the calendar and cost budgets"))
		}, enforceTimeout).Should(Succeed())

		By("Report mode: reported, nothing fenced")
		Expect(store.SetChecks(redisstore.CheckOptions{Mode: redisstore.CheckReport, Interval: -1})).To(Succeed())
		store.CheckStore(ctx)
		Eventually(func(g Gomega) {
			v := storeChecks(g)
			g.Expect(v.Status).To(BeEquivalentTo("True"))
			g.Expect(v.Reason).To(Equal(twv1alpha1.ReasonCheckFailed))
			g.Expect(v.Message).To(ContainSubstring("Report mode: nothing is fenced"))
		}, enforceTimeout).Should(Succeed())

		By("the check passing again")
		Expect(rs.Client().Do(ctx, "CONFIG", "SET", "maxmemory-policy", "noeviction").Err()).To(Succeed())
		store.CheckStore(ctx)
		Eventually(func(g Gomega) {
			v := storeChecks(g)
			g.Expect(v.Status).To(BeEquivalentTo("False"))
			g.Expect(v.Reason).To(Equal(twv1alpha1.ReasonChecksPass))
			g.Expect(v.Message).To(Equal("Every live replica's checks of Redis pass"))
		}, enforceTimeout).Should(Succeed())
	})
})
