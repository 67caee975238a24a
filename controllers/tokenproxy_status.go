// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package controllers

import (
	"context"
	"fmt"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	twv1alpha1 "github.com/tokenwarden/tokenwarden/api/v1alpha1"
)

func setCondition(conds *[]metav1.Condition, typ string, ok bool, reason, msg string, generation int64) {
	status := metav1.ConditionFalse
	if ok {
		status = metav1.ConditionTrue
	}
	meta.SetStatusCondition(conds, metav1.Condition{Type: typ, Status: status, Reason: reason, Message: msg, ObservedGeneration: generation})
}

// patchStatus writes a status only when it changed. It replaces the whole status (a
// conflict is retried by the next reconcile), so zero values such as readyReplicas: 0
// are stored too.
func (r *TokenProxyReconciler) patchStatus(ctx context.Context, obj client.Object, current, desired any) error {
	if equality.Semantic.DeepEqual(current, desired) {
		return nil
	}
	switch o := obj.(type) {
	case *twv1alpha1.TokenBudget:
		// A fleet's budgets are the cache's own objects (gather lists them without
		// copies): the one written is copied first. It is a merge patch of what
		// changed: the usage controller writes status.usage concurrently
		// (tokenbudget_usage.go), which must neither make this write conflict nor be
		// overwritten by it.
		o = o.DeepCopy()
		patch := client.MergeFrom(o.DeepCopy())
		o.Status = *desired.(*twv1alpha1.TokenBudgetStatus)
		if err := r.Status().Patch(ctx, o, patch); err != nil {
			return fmt.Errorf("patch status of %s: %w", o.GetName(), err)
		}
		return nil
	case *twv1alpha1.ApiKey:
		o = o.DeepCopy()
		o.Status = *desired.(*twv1alpha1.ApiKeyStatus)
		obj = o
	case *twv1alpha1.TokenProxy:
		o.Status = *desired.(*twv1alpha1.TokenProxyStatus)
	}
	if err := r.Status().Update(ctx, obj); err != nil {
		return fmt.Errorf("patch status of %s: %w", obj.GetName(), err)
	}
	return nil
}

// storageOf is the fleet's storage type, defaulted.
func storageOf(tp *twv1alpha1.TokenProxy) twv1alpha1.StorageType {
	if tp.Spec.Storage.Type == "" {
		return twv1alpha1.StorageMemory
	}
	return tp.Spec.Storage.Type
}

// fleetStatus is the TokenProxy's status: its Deployment's replicas and readiness,
// the config in force and its Enforced condition (when the config was written and the
// reports read: rs not nil), Accepted, and Degraded from the failed steps.
func (r *TokenProxyReconciler) fleetStatus(tp *twv1alpha1.TokenProxy, g *gathered, cfg configOutcome, deploy *appsv1.Deployment,
	rs *reports, ss *steps,
) *twv1alpha1.TokenProxyStatus {
	st := tp.Status.DeepCopy()
	st.ObservedGeneration = tp.Generation
	st.Storage = storageOf(tp)
	if cfg.refused != nil {
		r.refuseConfig(tp, &st.Conditions, cfg.refused)
	} else {
		r.setFleetAccepted(tp, &st.Conditions, g.credentials)
	}
	if cfg.written {
		st.Divisor, st.Budgets, st.Keys, st.ConfigGeneration = g.divisor, 0, 0, cfg.generation
		for _, v := range g.budgetVerdicts {
			if v.accepted {
				st.Budgets++
			}
		}
		for _, read := range g.allKeys {
			if read.verdict.accepted {
				st.Keys++
			}
		}
	}
	if rs != nil {
		setFleetEnforced(st, rs, cfg.generation, tp.Generation)
		setUpstreamHealth(st, tp, rs)
		if storageOf(tp) == twv1alpha1.StorageRedis {
			st.DurableEpochs = recordEpochs(st.DurableEpochs, rs, time.Now())
			setFenced(st, rs, tp.Generation)
		} else {
			meta.RemoveStatusCondition(&st.Conditions, twv1alpha1.ConditionDurableBudgetsFenced)
		}
	}
	var ready, updated int32
	st.Replicas, st.ReadyReplicas = 0, 0
	if deploy != nil {
		st.Replicas, st.ReadyReplicas = deploy.Status.Replicas, deploy.Status.ReadyReplicas
		ready, updated = deploy.Status.ReadyReplicas, deploy.Status.UpdatedReplicas
		sel, _ := metav1.LabelSelectorAsSelector(deploy.Spec.Selector)
		st.Selector = sel.String()
	}
	want := ptr.Deref(tp.Spec.Replicas, 1)
	if ready >= want && updated >= want {
		setCondition(&st.Conditions, twv1alpha1.ConditionReady, true, twv1alpha1.ReasonDeploymentReady,
			fmt.Sprintf("%d of %d proxies ready", ready, want), tp.Generation)
	} else {
		setCondition(&st.Conditions, twv1alpha1.ConditionReady, false, twv1alpha1.ReasonNotReady,
			fmt.Sprintf("%d of %d proxies ready", ready, want), tp.Generation)
	}
	r.setDegraded(tp, &st.Conditions, ss)
	return st
}

// setFleetEnforced sets the fleet's counts and Enforced condition: True when every
// live replica runs config generation g or a later one.
func setFleetEnforced(st *twv1alpha1.TokenProxyStatus, rs *reports, g, gen int64) {
	n, behind := rs.loaded(g)
	st.LiveReplicas, st.EnforcedReplicas = int32(len(rs.live)), n //nolint:gosec // bounded by the Leases listed
	st.Enforced = fmt.Sprintf("%d/%d", st.EnforcedReplicas, st.LiveReplicas)
	switch {
	case len(rs.live) == 0:
		setCondition(&st.Conditions, twv1alpha1.ConditionEnforced, false, twv1alpha1.ReasonNoReplicas,
			fmt.Sprintf("No proxy replica reports: no renewed Lease labelled %s", twv1alpha1.ReplicaConfigMapLabel), gen)
	case behind != nil:
		setCondition(&st.Conditions, twv1alpha1.ConditionEnforced, false, twv1alpha1.ReasonReplicasBehind,
			fmt.Sprintf("%d of %d live replicas have loaded config generation %d; replica %s %s",
				n, len(rs.live), g, behind.name, behind.loadedWhat()), gen)
	default:
		setCondition(&st.Conditions, twv1alpha1.ConditionEnforced, true, twv1alpha1.ReasonAllReplicasCurrent,
			fmt.Sprintf("All %d live replicas have loaded config generation %d", n, g), gen)
	}
}

// reconcileStatuses writes the statuses: the fleet's budgets and keys when the config
// was written (their conditions name its generation), and the TokenProxy's in one
// write. It returns when a replica's report Lease expires.
func (r *TokenProxyReconciler) reconcileStatuses(ctx context.Context, tp *twv1alpha1.TokenProxy, g *gathered, cfg configOutcome,
	deploy *appsv1.Deployment, ss *steps,
) (time.Duration, error) {
	now := time.Now()
	var rs *reports
	if cfg.written {
		var err error
		if rs, err = r.readReports(ctx, tp, now, cfg.generation, cfg.digest); ss.record(stepStatus, err) {
			ss.record(stepStatus, r.writeObjectStatuses(ctx, tp, g, cfg.generation, rs))
		} else {
			rs = nil
		}
	}
	st := r.fleetStatus(tp, g, cfg, deploy, rs, ss)
	// A newly recorded durable epoch goes into the config at once: the next reconcile
	// renders it.
	epochsChanged := !equality.Semantic.DeepEqual(st.DurableEpochs, tp.Status.DurableEpochs)
	if err := r.patchStatus(ctx, tp, &tp.Status, st); err != nil {
		return 0, err
	}
	if rs == nil {
		return 0, nil
	}
	if epochsChanged {
		return time.Millisecond, nil
	}
	return rs.requeue(now), nil
}

// markProxyNotFound sets Accepted=False/ProxyNotFound on the objects that reference a
// fleet that does not exist.
func (r *TokenProxyReconciler) markProxyNotFound(ctx context.Context, name types.NamespacedName) error {
	// An object in another namespace is told the fleet's namespace too.
	notFound := func(o client.Object) string {
		if foreign(o) {
			return fmt.Sprintf("TokenProxy %s not found", name)
		}
		return fmt.Sprintf("TokenProxy %s not found", name.Name)
	}
	var budgets twv1alpha1.TokenBudgetList
	if err := r.List(ctx, &budgets, client.MatchingFields{proxyRefField: name.String()}); err != nil {
		return err
	}
	for i := range budgets.Items {
		b := &budgets.Items[i]
		st := b.Status.DeepCopy()
		st.ObservedGeneration = b.Generation
		st.Replicas, st.PerReplica, st.Storage = 0, twv1alpha1.PerReplicaAllowance{}, ""
		st.Summary = summary(b, false, 1)
		setCondition(&st.Conditions, twv1alpha1.ConditionAccepted, false, twv1alpha1.ReasonProxyNotFound, notFound(b), b.Generation)
		setCondition(&st.Conditions, twv1alpha1.ConditionReady, false, twv1alpha1.ReasonProxyNotFound, notFound(b), b.Generation)
		st.ConfigGeneration = 0
		setCondition(&st.Conditions, twv1alpha1.ConditionEnforced, false, twv1alpha1.ReasonNotInConfig, "Not in a fleet's config: "+notFound(b), b.Generation)
		if err := r.patchStatus(ctx, b, &b.Status, st); err != nil {
			return err
		}
	}
	var keys twv1alpha1.ApiKeyList
	if err := r.List(ctx, &keys, client.MatchingFields{proxyRefField: name.String()}); err != nil {
		return err
	}
	for i := range keys.Items {
		k := &keys.Items[i]
		st := k.Status.DeepCopy()
		st.ObservedGeneration = k.Generation
		setCondition(&st.Conditions, twv1alpha1.ConditionAccepted, false, twv1alpha1.ReasonProxyNotFound, notFound(k), k.Generation)
		setCondition(&st.Conditions, twv1alpha1.ConditionReady, false, twv1alpha1.ReasonProxyNotFound, notFound(k), k.Generation)
		st.ConfigGeneration = 0
		setCondition(&st.Conditions, twv1alpha1.ConditionEnforced, false, twv1alpha1.ReasonNotInConfig, "Not in a fleet's config: "+notFound(k), k.Generation)
		if err := r.patchStatus(ctx, k, &k.Status, st); err != nil {
			return err
		}
	}
	log.FromContext(ctx).V(1).Info("TokenProxy not found; marked its references", "budgets", len(budgets.Items), "keys", len(keys.Items))
	return nil
}
