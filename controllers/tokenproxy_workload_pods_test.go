// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package controllers_test

import (
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	twv1alpha1 "github.com/tokenwarden/tokenwarden/api/v1alpha1"
)

var _ = Describe("The fleet's pods, policy and monitor, as the TokenProxy sets them", func() {
	It("renders pod labels under the selector's, image pull secrets, affinity and topology spread", func() {
		ns := newNamespace("podknobs")
		tp := fleetProxy(ns, 2)
		tp.Spec.PodLabels = map[string]string{"team": "ml", "app.kubernetes.io/instance": "hijack"}
		tp.Spec.ImagePullSecrets = []corev1.LocalObjectReference{{Name: "registry"}}
		tp.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
			RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
				MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "pool", Operator: corev1.NodeSelectorOpIn, Values: []string{"proxies"}}},
			}}},
		}}
		tp.Spec.TopologySpreadConstraints = []corev1.TopologySpreadConstraint{{
			MaxSkew: 1, TopologyKey: "topology.kubernetes.io/zone", WhenUnsatisfiable: corev1.ScheduleAnyway,
		}}
		Expect(k8sClient.Create(ctx, tp)).To(Succeed())
		Eventually(func(g Gomega) {
			pod := deployment(g, ns).Spec.Template
			g.Expect(pod.Labels).To(HaveKeyWithValue("team", "ml"))
			g.Expect(pod.Labels).To(HaveKeyWithValue("app.kubernetes.io/instance", "fleet"), "the selector's labels win")
			g.Expect(pod.Spec.ImagePullSecrets).To(ConsistOf(corev1.LocalObjectReference{Name: "registry"}))
			g.Expect(pod.Spec.Affinity).To(Equal(tp.Spec.Affinity))
			g.Expect(pod.Spec.TopologySpreadConstraints).To(HaveLen(1))
			tsc := pod.Spec.TopologySpreadConstraints[0]
			g.Expect(tsc.TopologyKey).To(Equal("topology.kubernetes.io/zone"))
			g.Expect(tsc.LabelSelector).To(Equal(&metav1.LabelSelector{MatchLabels: map[string]string{
				"app.kubernetes.io/name": "tokenwarden-proxy", "app.kubernetes.io/instance": "fleet",
			}}), "a constraint without a selector spreads this fleet's pods")
		}).Should(Succeed())
	})

	It("runs a NetworkPolicy: the client port from the peers given or anywhere, the admin port from its peers only", func() {
		ns := newNamespace("netpol")
		tp := fleetProxy(ns, 1)
		monitoring := networkingv1.NetworkPolicyPeer{NamespaceSelector: &metav1.LabelSelector{
			MatchLabels: map[string]string{"kubernetes.io/metadata.name": "monitoring"}}}
		tp.Spec.NetworkPolicy = twv1alpha1.NetworkPolicySpec{Enabled: true, AdminFrom: []networkingv1.NetworkPolicyPeer{monitoring}}
		Expect(k8sClient.Create(ctx, tp)).To(Succeed())
		var np networkingv1.NetworkPolicy
		key := client.ObjectKey{Namespace: ns, Name: "fleet-proxy"}
		Eventually(func(g Gomega) {
			g.Expect(k8sClient.Get(ctx, key, &np)).To(Succeed())
		}).Should(Succeed())
		tcp := ptr.To(corev1.ProtocolTCP)
		Expect(np.Spec.PodSelector.MatchLabels).To(Equal(map[string]string{
			"app.kubernetes.io/name": "tokenwarden-proxy", "app.kubernetes.io/instance": "fleet"}))
		Expect(np.Spec.PolicyTypes).To(ConsistOf(networkingv1.PolicyTypeIngress))
		Expect(np.Spec.Ingress).To(Equal([]networkingv1.NetworkPolicyIngressRule{
			{Ports: []networkingv1.NetworkPolicyPort{{Protocol: tcp, Port: ptr.To(intstr.FromInt(8080))}}},
			{Ports: []networkingv1.NetworkPolicyPort{{Protocol: tcp, Port: ptr.To(intstr.FromInt(9090))}},
				From: []networkingv1.NetworkPolicyPeer{monitoring}},
		}))
		Expect(np.OwnerReferences).To(ContainElement(HaveField("Name", "fleet")))

		By("disabling it deleting it")
		Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(tp), tp)).To(Succeed())
		patch := client.MergeFrom(tp.DeepCopy())
		tp.Spec.NetworkPolicy.Enabled = false
		Expect(k8sClient.Patch(ctx, tp, patch)).To(Succeed())
		Eventually(func() bool { return apierrors.IsNotFound(k8sClient.Get(ctx, key, &np)) }).Should(BeTrue())
	})

	It("sets the ServiceMonitor's labels under the operator's, and its interval", func() {
		installServiceMonitorCRD()
		ns := newNamespace("smspec")
		tp := fleetProxy(ns, 1)
		tp.Spec.ServiceMonitor = true
		tp.Spec.ServiceMonitorSpec = &twv1alpha1.ServiceMonitorSpec{
			Labels:   map[string]string{"release": "kube-prometheus-stack", "app.kubernetes.io/managed-by": "me"},
			Interval: "1m",
		}
		Expect(k8sClient.Create(ctx, tp)).To(Succeed())
		sm := &unstructured.Unstructured{}
		sm.SetGroupVersionKind(schema.GroupVersionKind{Group: "monitoring.coreos.com", Version: "v1", Kind: "ServiceMonitor"})
		Eventually(func(g Gomega) {
			g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: "fleet-proxy"}, sm)).To(Succeed())
			g.Expect(sm.GetLabels()).To(HaveKeyWithValue("release", "kube-prometheus-stack"))
			g.Expect(sm.GetLabels()).To(HaveKeyWithValue("app.kubernetes.io/managed-by", "tokenwarden"))
			endpoints, _, _ := unstructured.NestedSlice(sm.Object, "spec", "endpoints")
			g.Expect(endpoints).To(ConsistOf(HaveKeyWithValue("interval", "1m")))
		}).Should(Succeed())
	})
})
