// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package controllers

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	twv1alpha1 "github.com/tokenwarden/tokenwarden/api/v1alpha1"
	"github.com/tokenwarden/tokenwarden/controllers/render"
)

// adminServiceName is the Service of the proxies' admin port (/metrics, /healthz,
// /readyz, /admin/effective): kept off the client Service, so a client of the fleet
// cannot reach it, and scraped by the fleet's ServiceMonitor.
func adminServiceName(tp *twv1alpha1.TokenProxy) string { return proxyName(tp) + "-admin" }

// adminLabels are the admin Service's labels, which the ServiceMonitor selects.
func adminLabels(tp *twv1alpha1.TokenProxy) map[string]string {
	l := labels(tp)
	l["app.kubernetes.io/component"] = "admin"
	return l
}

// applyServices runs the client Service (the proxy port only) and the admin Service.
func (r *TokenProxyReconciler) applyServices(ctx context.Context, tp *twv1alpha1.TokenProxy) error {
	for _, s := range []struct {
		name   string
		labels map[string]string
		port   corev1.ServicePort
	}{
		{proxyName(tp), labels(tp), corev1.ServicePort{Name: "http", Port: render.ProxyPort, TargetPort: intstr.FromString("http"), Protocol: corev1.ProtocolTCP}},
		{adminServiceName(tp), adminLabels(tp), corev1.ServicePort{Name: "admin", Port: render.AdminPort, TargetPort: intstr.FromString("admin"), Protocol: corev1.ProtocolTCP}},
	} {
		svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: s.name, Namespace: tp.Namespace}}
		if _, err := controllerutil.CreateOrUpdate(ctx, r.Client, svc, func() error {
			svc.Labels = s.labels
			svc.Spec.Selector = selectorLabels(tp)
			svc.Spec.Ports = []corev1.ServicePort{s.port}
			return controllerutil.SetControllerReference(tp, svc, r.Scheme())
		}); err != nil {
			return fmt.Errorf("apply Service %s: %w", s.name, err)
		}
	}
	return nil
}

// applyDisruptionBudget keeps a voluntary disruption (a node drain, a cluster
// upgrade) to one proxy at a time while the fleet has more than one; a fleet of one
// has none, so that a node drain is not blocked.
func (r *TokenProxyReconciler) applyDisruptionBudget(ctx context.Context, tp *twv1alpha1.TokenProxy) error {
	pdb := &policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Name: proxyName(tp), Namespace: tp.Namespace}}
	if ptr.Deref(tp.Spec.Replicas, 1) <= 1 {
		if err := r.Delete(ctx, pdb); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete PodDisruptionBudget: %w", err)
		}
		return nil
	}
	if _, err := controllerutil.CreateOrUpdate(ctx, r.Client, pdb, func() error {
		pdb.Labels = labels(tp)
		pdb.Spec.Selector = &metav1.LabelSelector{MatchLabels: selectorLabels(tp)}
		pdb.Spec.MaxUnavailable = ptr.To(intstr.FromInt32(1))
		pdb.Spec.MinAvailable = nil
		return controllerutil.SetControllerReference(tp, pdb, r.Scheme())
	}); err != nil {
		return fmt.Errorf("apply PodDisruptionBudget: %w", err)
	}
	return nil
}

// applyNetworkPolicy runs the fleet's NetworkPolicy while spec.networkPolicy.enabled:
// ingress to the client port from spec.networkPolicy.clientFrom (every peer when
// empty), to the admin port from adminFrom only; it deletes the policy otherwise.
func (r *TokenProxyReconciler) applyNetworkPolicy(ctx context.Context, tp *twv1alpha1.TokenProxy) error {
	np := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: proxyName(tp), Namespace: tp.Namespace}}
	spec := tp.Spec.NetworkPolicy
	if !spec.Enabled {
		// Only a policy the cache holds is deleted: an unchanged fleet sends no write.
		if err := r.Get(ctx, client.ObjectKeyFromObject(np), np); apierrors.IsNotFound(err) {
			return nil
		}
		if err := r.Delete(ctx, np); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete NetworkPolicy: %w", err)
		}
		return nil
	}
	tcp := ptr.To(corev1.ProtocolTCP)
	port := func(n int) []networkingv1.NetworkPolicyPort {
		return []networkingv1.NetworkPolicyPort{{Protocol: tcp, Port: ptr.To(intstr.FromInt(n))}}
	}
	rules := []networkingv1.NetworkPolicyIngressRule{{Ports: port(render.ProxyPort), From: spec.ClientFrom}}
	if len(spec.AdminFrom) > 0 {
		rules = append(rules, networkingv1.NetworkPolicyIngressRule{Ports: port(render.AdminPort), From: spec.AdminFrom})
	}
	if _, err := controllerutil.CreateOrUpdate(ctx, r.Client, np, func() error {
		np.Labels = labels(tp)
		np.Spec = networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: selectorLabels(tp)},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			Ingress:     rules,
		}
		return controllerutil.SetControllerReference(tp, np, r.Scheme())
	}); err != nil {
		return fmt.Errorf("apply NetworkPolicy: %w", err)
	}
	return nil
}

// defaultRequests are the proxy container's requests when the TokenProxy sets neither
// a request nor a limit for the resource.
var defaultRequests = corev1.ResourceList{
	corev1.ResourceCPU:    resource.MustParse("100m"),
	corev1.ResourceMemory: resource.MustParse("128Mi"),
}

// proxyResources are spec.resources with a default request for each resource that it
// neither requests nor limits (a limit alone already sets the request to it).
func proxyResources(set corev1.ResourceRequirements) corev1.ResourceRequirements {
	out := *set.DeepCopy()
	for name, q := range defaultRequests {
		_, requested := set.Requests[name]
		_, limited := set.Limits[name]
		if requested || limited {
			continue
		}
		if out.Requests == nil {
			out.Requests = corev1.ResourceList{}
		}
		out.Requests[name] = q.DeepCopy()
	}
	return out
}
