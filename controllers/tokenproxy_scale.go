// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package controllers

import (
	"context"
	"fmt"
	"sync"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	twv1alpha1 "github.com/tokenwarden/tokenwarden/api/v1alpha1"
)

// scaleFieldManager is the field manager of the scaler's writes of a Deployment's
// replicas; the fleet's reconcile takes the field back on its next apply.
const scaleFieldManager = "tokenwarden-scale"

// scaleLocks serializes, per fleet, the writes of its Deployment's replicas: the
// scaler's and the reconcile's apply, each with the replicas it read under the lock.
type scaleLocks struct{ m sync.Map }

// lock takes the lock of fleet and returns its unlock.
func (l *scaleLocks) lock(fleet types.NamespacedName) func() {
	v, _ := l.m.LoadOrStore(fleet, &sync.Mutex{})
	mu := v.(*sync.Mutex)
	mu.Lock()
	return mu.Unlock
}

// forget drops the lock of a fleet that is gone.
func (l *scaleLocks) forget(fleet types.NamespacedName) { l.m.Delete(fleet) }

// fleetScaler applies a change of a TokenProxy's replicas to its Deployment at once,
// apart from the fleet's reconcile, so that a scale never waits for a render of the
// fleet's config (which takes seconds at tens of thousands of keys). The reconcile
// renders the division for the new size after it.
type fleetScaler struct{ r *TokenProxyReconciler }

// setupScaler registers the scaler: it sees only changes of a TokenProxy's replicas.
func (r *TokenProxyReconciler) setupScaler(mgr ctrl.Manager) error {
	replicasChanged := predicate.Funcs{
		CreateFunc:  func(event.CreateEvent) bool { return false },
		DeleteFunc:  func(event.DeleteEvent) bool { return false },
		GenericFunc: func(event.GenericEvent) bool { return false },
		UpdateFunc: func(e event.UpdateEvent) bool {
			return desiredReplicas(e.ObjectOld) != desiredReplicas(e.ObjectNew)
		},
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named("tokenproxy-scale").
		For(&twv1alpha1.TokenProxy{}, builder.WithPredicates(replicasChanged)).
		Complete(&fleetScaler{r: r})
}

// desiredReplicas is the Deployment's replicas a TokenProxy asks for; 0 for another object.
func desiredReplicas(o client.Object) int32 {
	tp, ok := o.(*twv1alpha1.TokenProxy)
	if !ok {
		return 0
	}
	return ptr.Deref(tp.Spec.Replicas, 1)
}

// Reconcile sets the fleet's Deployment's replicas to its TokenProxy's, when the
// Deployment exists and is the fleet's; everything else is the reconcile's.
func (s *fleetScaler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	defer s.r.scales.lock(req.NamespacedName)()
	var tp twv1alpha1.TokenProxy
	if err := s.r.Get(ctx, req.NamespacedName, &tp); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !tp.DeletionTimestamp.IsZero() {
		return ctrl.Result{}, nil
	}
	var d appsv1.Deployment
	if err := s.r.Get(ctx, client.ObjectKey{Namespace: tp.Namespace, Name: proxyName(&tp)}, &d); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	want := ptr.Deref(tp.Spec.Replicas, 1)
	if !metav1.IsControlledBy(&d, &tp) || ptr.Deref(d.Spec.Replicas, 1) == want {
		return ctrl.Result{}, nil
	}
	patch := client.MergeFrom(d.DeepCopy())
	d.Spec.Replicas = ptr.To(want)
	if err := s.r.Patch(ctx, &d, patch, client.FieldOwner(scaleFieldManager)); err != nil {
		return ctrl.Result{}, fmt.Errorf("scale Deployment %s: %w", d.Name, err)
	}
	logf.FromContext(ctx).V(1).Info("scaled the fleet's Deployment", "replicas", want)
	return ctrl.Result{}, nil
}

// latestReplicas is the replicas of tp's newest version in the cache: a reconcile
// that read tp before a scale applies the scale, never the size before it.
func (r *TokenProxyReconciler) latestReplicas(ctx context.Context, tp *twv1alpha1.TokenProxy) int32 {
	var now twv1alpha1.TokenProxy
	if err := r.Get(ctx, client.ObjectKeyFromObject(tp), &now); err == nil && now.UID == tp.UID {
		return ptr.Deref(now.Spec.Replicas, 1)
	}
	return ptr.Deref(tp.Spec.Replicas, 1)
}
