// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package controllers_test

import (
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	twv1alpha1 "github.com/tokenwarden/tokenwarden/api/v1alpha1"
)

func deployment(g Gomega, ns string) *appsv1.Deployment {
	var d appsv1.Deployment
	g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: "fleet-proxy"}, &d)).To(Succeed())
	return &d
}

var _ = Describe("The fleet's Deployment, applied server-side", func() {
	It("keeps other managers' fields, such as kubectl rollout restart's annotation, and sends no write for an unchanged fleet", func() {
		ns := newNamespace("ssa")
		tp := fleetProxy(ns, 2)
		Expect(k8sClient.Create(ctx, tp)).To(Succeed())
		Eventually(func(g Gomega) { deployment(g, ns) }).Should(Succeed())

		By("kubectl rollout restart, as another field manager")
		d := deployment(Default, ns)
		patch := client.MergeFrom(d.DeepCopy())
		if d.Spec.Template.Annotations == nil {
			d.Spec.Template.Annotations = map[string]string{}
		}
		d.Spec.Template.Annotations["kubectl.kubernetes.io/restartedAt"] = "2026-11-30T06:00:00Z"
		Expect(k8sClient.Patch(ctx, d, patch, client.FieldOwner("kubectl-rollout"))).To(Succeed())
		Expect(deployment(Default, ns).ManagedFields).To(ContainElement(HaveField("Manager", "tokenwarden")))
		Expect(*deployment(Default, ns).Spec.Template.Spec.TerminationGracePeriodSeconds).To(Equal(int64(5+300+10)),
			"a stopping proxy drains for its longest upstream timeout (default 300 s) after 5 s of failing readiness")

		By("a change of the fleet that the Deployment carries")
		Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(tp), tp)).To(Succeed())
		tpPatch := client.MergeFrom(tp.DeepCopy())
		tp.Spec.PodAnnotations = map[string]string{"team": "research"}
		Expect(k8sClient.Patch(ctx, tp, tpPatch)).To(Succeed())
		Eventually(func(g Gomega) {
			a := deployment(g, ns).Spec.Template.Annotations
			g.Expect(a).To(HaveKeyWithValue("team", "research"))
			g.Expect(a).To(HaveKeyWithValue("kubectl.kubernetes.io/restartedAt", "2026-11-30T06:00:00Z"), "the restart is not undone")
		}).Should(Succeed())

		By("a reconcile that changes nothing in the Deployment, the Services or the disruption budget")
		before := deployment(Default, ns).ResourceVersion
		versions := func(g Gomega) []string {
			var out []string
			for _, o := range []client.Object{&corev1.Service{}, &corev1.Service{}, &policyv1.PodDisruptionBudget{}, &corev1.ServiceAccount{}} {
				name := "fleet-proxy"
				if len(out) == 1 {
					name = "fleet-proxy-admin"
				}
				g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, o)).To(Succeed())
				out = append(out, o.GetResourceVersion())
			}
			return out
		}
		others := versions(Default)
		Expect(k8sClient.Create(ctx, tokenBudget(ns, "global", twv1alpha1.DimensionGlobal, "", 1000, 0))).To(Succeed())
		Eventually(func(g Gomega) {
			g.Expect(rendered(g, ns).RateLimiting.Limits.Global.TokensPerMinute).To(Equal(int64(1000)))
			g.Expect(condition(budgetStatus(g, ns, "global").Conditions, "Ready").Status).To(BeEquivalentTo("True"))
		}).Should(Succeed())
		Consistently(func(g Gomega) {
			g.Expect(deployment(g, ns).ResourceVersion).To(Equal(before))
			g.Expect(versions(g)).To(Equal(others))
		}, "500ms").Should(Succeed())
	})

	It("takes over the fields an earlier release set by update, so that the ones it no longer sets are removed", func() {
		ns := newNamespace("ssa-upgrade")
		sel := map[string]string{"app.kubernetes.io/name": "tokenwarden-proxy", "app.kubernetes.io/instance": "fleet"}
		old := &appsv1.Deployment{
			ObjectMeta: metav1.ObjectMeta{Name: "fleet-proxy", Namespace: ns, Labels: sel},
			Spec: appsv1.DeploymentSpec{
				Selector: &metav1.LabelSelector{MatchLabels: sel},
				Template: corev1.PodTemplateSpec{
					ObjectMeta: metav1.ObjectMeta{Labels: sel, Annotations: map[string]string{"removed": "yes"}},
					Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "proxy", Image: "tokenwarden:old",
						Env: []corev1.EnvVar{{Name: "TOKENWARDEN_UPSTREAM_GONE_KEY", Value: "x"}}}}},
				},
			},
		}
		Expect(k8sClient.Create(ctx, old, client.FieldOwner("manager"))).To(Succeed(), "as the operator's binary did before")
		Expect(k8sClient.Create(ctx, fleetProxy(ns, 1))).To(Succeed())
		Eventually(func(g Gomega) {
			d := deployment(g, ns)
			g.Expect(d.Spec.Template.Spec.Containers[0].Image).To(Equal("tokenwarden:test"))
			g.Expect(d.Spec.Template.Spec.Containers[0].Env).NotTo(ContainElement(HaveField("Name", "TOKENWARDEN_UPSTREAM_GONE_KEY")))
			g.Expect(d.Spec.Template.Annotations).NotTo(HaveKey("removed"))
			g.Expect(d.ManagedFields).NotTo(ContainElement(HaveField("Manager", "manager")))
		}).Should(Succeed())
	})
})
