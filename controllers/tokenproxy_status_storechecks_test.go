// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package controllers_test

import (
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	twv1alpha1 "github.com/tokenwarden/tokenwarden/api/v1alpha1"
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
			g.Expect(verdictOf(proxyStatus(g, ns).Conditions, twv1alpha1.ConditionAccepted).Status).To(BeEquivalentTo("True"))
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
})
