// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package controllers

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

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

// serviceMonitorInstalled reports whether the cluster serves ServiceMonitors.
func serviceMonitorInstalled(mapper meta.RESTMapper) bool {
	_, err := mapper.RESTMapping(serviceMonitorGVK.GroupKind(), serviceMonitorGVK.Version)
	return err == nil
}

// applyServiceMonitor creates the fleet's ServiceMonitor when the TokenProxy asks for
// one, and deletes it when it no longer does. Without the CRD it does nothing.
func (r *TokenProxyReconciler) applyServiceMonitor(ctx context.Context, tp *twv1alpha1.TokenProxy) error {
	if !r.monitors {
		return nil
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
		sm.SetLabels(labels(tp))
		spec := map[string]any{
			"selector": map[string]any{"matchLabels": toAny(adminLabels(tp))},
			"endpoints": []any{map[string]any{
				"port": "admin", "path": "/metrics", "interval": "15s",
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
