// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package controllers

import (
	"context"
	"fmt"
	"maps"
	"sync"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	twv1alpha1 "github.com/tokenwarden/tokenwarden/api/v1alpha1"
)

// serviceMonitorGVK is the Prometheus Operator's ServiceMonitor. It is handled as
// unstructured so the operator needs neither its Go module nor its CRD.
var serviceMonitorGVK = schema.GroupVersionKind{Group: "monitoring.coreos.com", Version: "v1", Kind: "ServiceMonitor"}

func newServiceMonitor() *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(serviceMonitorGVK)
	return u
}

// serviceMonitorCRD is the name of the ServiceMonitor CRD, whose installation after
// the operator started is watched for.
const serviceMonitorCRD = "servicemonitors.monitoring.coreos.com"

// serviceMonitorInstalled reports whether the cluster serves ServiceMonitors. The
// manager's RESTMapper asks the API server's discovery again on a group it does not
// know, so a CRD installed after start is found.
func serviceMonitorInstalled(mapper meta.RESTMapper) bool {
	_, err := mapper.RESTMapping(serviceMonitorGVK.GroupKind(), serviceMonitorGVK.Version)
	return err == nil
}

// monitors watches the fleets' ServiceMonitors once the cluster serves them: at
// setup, or at the first reconcile that wants one after the CRD is installed.
type monitors struct {
	mu      sync.Mutex
	served  bool
	mapper  meta.RESTMapper
	watch   func() error // starts the watch of the owned ServiceMonitors
	started bool
}

// available reports whether the cluster serves ServiceMonitors, and starts the watch
// of the owned ones the first time it does.
func (m *monitors) available() (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.served {
		m.served = serviceMonitorInstalled(m.mapper)
	}
	if m.served && !m.started && m.watch != nil {
		if err := m.watch(); err != nil {
			return false, fmt.Errorf("watch ServiceMonitors: %w", err)
		}
		m.started = true
	}
	return m.served, nil
}

// seen reports whether the cluster served ServiceMonitors at the last look.
func (m *monitors) seen() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.served
}

// crdEvents are the events of the ServiceMonitor CRD, watched as metadata only.
func crdEvents() *metav1.PartialObjectMetadata {
	crd := &metav1.PartialObjectMetadata{}
	crd.SetGroupVersionKind(schema.GroupVersionKind{Group: "apiextensions.k8s.io", Version: "v1", Kind: "CustomResourceDefinition"})
	return crd
}

// proxiesWantingMonitors maps the ServiceMonitor CRD to every fleet that asks for a
// ServiceMonitor, so that a CRD installed after start is picked up.
func (r *TokenProxyReconciler) proxiesWantingMonitors(ctx context.Context, o client.Object) []reconcile.Request {
	if o.GetName() != serviceMonitorCRD {
		return nil
	}
	var proxies twv1alpha1.TokenProxyList
	if err := r.List(ctx, &proxies); err != nil {
		return nil
	}
	var out []reconcile.Request
	for i := range proxies.Items {
		if proxies.Items[i].Spec.ServiceMonitor {
			out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&proxies.Items[i])})
		}
	}
	return out
}

// applyServiceMonitor creates the fleet's ServiceMonitor when the TokenProxy asks for
// one, and deletes it when it no longer does. Without the CRD it does nothing.
func (r *TokenProxyReconciler) applyServiceMonitor(ctx context.Context, tp *twv1alpha1.TokenProxy) error {
	if !tp.Spec.ServiceMonitor && !r.monitors.seen() {
		return nil // nothing to delete: the cluster served none at the last look
	}
	if ok, err := r.monitors.available(); !ok || err != nil {
		return err
	}
	sm := newServiceMonitor()
	sm.SetNamespace(tp.Namespace)
	sm.SetName(proxyName(tp))
	if !tp.Spec.ServiceMonitor {
		if err := r.Delete(ctx, sm); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete ServiceMonitor: %w", err)
		}
		return nil
	}
	_, err := controllerutil.CreateOrUpdate(ctx, r.Client, sm, func() error {
		smLabels, interval := map[string]string{}, "15s"
		if o := tp.Spec.ServiceMonitorSpec; o != nil {
			maps.Copy(smLabels, o.Labels)
			if o.Interval != "" {
				interval = o.Interval
			}
		}
		maps.Copy(smLabels, labels(tp)) // the operator's labels win
		sm.SetLabels(smLabels)
		spec := map[string]any{
			"selector": map[string]any{"matchLabels": toAny(adminLabels(tp))},
			"endpoints": []any{map[string]any{
				"port": "admin", "path": "/metrics", "interval": interval,
			}},
		}
		if err := unstructured.SetNestedField(sm.Object, spec, "spec"); err != nil {
			return err
		}
		return controllerutil.SetControllerReference(tp, sm, r.Scheme())
	})
	if err != nil {
		return fmt.Errorf("apply ServiceMonitor: %w", err)
	}
	return nil
}

func toAny(m map[string]string) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}
