// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package controllers_test

import (
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

var _ = Describe("The fleet's availability and exposure", func() {
	It("keeps a disruption to one proxy at a time while the fleet has more than one", func() {
		ns := newNamespace("pdb")
		tp := fleetProxy(ns, 3)
		Expect(k8sClient.Create(ctx, tp)).To(Succeed())
		var pdb policyv1.PodDisruptionBudget
		Eventually(func(g Gomega) {
			g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: "fleet-proxy"}, &pdb)).To(Succeed())
		}).Should(Succeed())
		Expect(pdb.Spec.MaxUnavailable).To(Equal(ptr.To(intstr.FromInt32(1))))
		Expect(pdb.Spec.Selector.MatchLabels).To(Equal(map[string]string{
			"app.kubernetes.io/name": "tokenwarden-proxy", "app.kubernetes.io/instance": "fleet"}))
		Expect(pdb.OwnerReferences).To(ContainElement(HaveField("Name", "fleet")))

		By("a fleet scaled to one: no budget, so a node drain is not blocked")
		patch := client.MergeFrom(tp.DeepCopy())
		tp.Spec.Replicas = ptr.To(int32(1))
		Expect(k8sClient.Patch(ctx, tp, patch)).To(Succeed())
		Eventually(func() bool {
			return apierrors.IsNotFound(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: "fleet-proxy"}, &pdb))
		}).Should(BeTrue())
	})

	It("requests 100m CPU and 128Mi by default, and keeps what spec.resources sets", func() {
		ns := newNamespace("requests")
		Expect(k8sClient.Create(ctx, fleetProxy(ns, 1))).To(Succeed())
		Eventually(func(g Gomega) {
			r := deployment(g, ns).Spec.Template.Spec.Containers[0].Resources
			g.Expect(r.Requests.Cpu().Equal(resource.MustParse("100m"))).To(BeTrue())
			g.Expect(r.Requests.Memory().Equal(resource.MustParse("128Mi"))).To(BeTrue())
			g.Expect(r.Limits).To(BeEmpty())
		}).Should(Succeed())

		ns = newNamespace("requests")
		tp := fleetProxy(ns, 1)
		tp.Spec.Resources = corev1.ResourceRequirements{
			Requests: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("1Gi")},
			Limits:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("50m")},
		}
		Expect(k8sClient.Create(ctx, tp)).To(Succeed())
		Eventually(func(g Gomega) {
			r := deployment(g, ns).Spec.Template.Spec.Containers[0].Resources
			g.Expect(r.Requests.Memory().Equal(resource.MustParse("1Gi"))).To(BeTrue())
			g.Expect(r.Limits.Cpu().Equal(resource.MustParse("50m"))).To(BeTrue())
			g.Expect(r.Requests).NotTo(HaveKey(corev1.ResourceCPU), "a CPU limit alone sets the request; a default above it would be refused")
		}).Should(Succeed())
	})

	It("keeps the admin port off the client Service, on a Service the ServiceMonitor scrapes", func() {
		installServiceMonitorCRD()
		ns := newNamespace("admin")
		tp := fleetProxy(ns, 1)
		tp.Spec.ServiceMonitor = true
		Expect(k8sClient.Create(ctx, tp)).To(Succeed())
		var svc, admin corev1.Service
		Eventually(func(g Gomega) {
			g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: "fleet-proxy"}, &svc)).To(Succeed())
			g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: "fleet-proxy-admin"}, &admin)).To(Succeed())
		}).Should(Succeed())
		Expect(svc.Spec.Ports).To(ConsistOf(And(HaveField("Name", "http"), HaveField("Port", int32(8080)))))
		Expect(admin.Spec.Ports).To(ConsistOf(And(HaveField("Name", "admin"), HaveField("Port", int32(9090)))))
		Expect(admin.Spec.Selector).To(Equal(svc.Spec.Selector))
		Expect(admin.OwnerReferences).To(ContainElement(HaveField("Name", "fleet")))

		sm := &unstructured.Unstructured{}
		sm.SetGroupVersionKind(schema.GroupVersionKind{Group: "monitoring.coreos.com", Version: "v1", Kind: "ServiceMonitor"})
		Eventually(func(g Gomega) {
			g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: "fleet-proxy"}, sm)).To(Succeed())
		}).Should(Succeed())
		selector, _, _ := unstructured.NestedStringMap(sm.Object, "spec", "selector", "matchLabels")
		for k, v := range selector {
			Expect(admin.Labels).To(HaveKeyWithValue(k, v), "the ServiceMonitor selects the admin Service")
		}
		Expect(svc.Labels).NotTo(HaveKeyWithValue("app.kubernetes.io/component", "admin"), "and not the client Service")
		Expect(selector).To(HaveKeyWithValue("app.kubernetes.io/component", "admin"))
	})
})
