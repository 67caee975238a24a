// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package controllers

import (
	"context"
	"fmt"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	twv1alpha1 "github.com/tokenwarden/tokenwarden/api/v1alpha1"
	"github.com/tokenwarden/tokenwarden/proxy/budget"
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
		o.Status = *desired.(*twv1alpha1.TokenBudgetStatus)
	case *twv1alpha1.ApiKey:
		o.Status = *desired.(*twv1alpha1.ApiKeyStatus)
	case *twv1alpha1.TokenProxy:
		o.Status = *desired.(*twv1alpha1.TokenProxyStatus)
	}
	if err := r.Status().Update(ctx, obj); err != nil {
		return fmt.Errorf("patch status of %s: %w", obj.GetName(), err)
	}
	return nil
}

// writeStatuses writes the status of the fleet and of every TokenBudget and ApiKey it
// read, and records events for what an operator must act on.
func (r *TokenProxyReconciler) writeStatuses(ctx context.Context, tp *twv1alpha1.TokenProxy, g *gathered, deploy *appsv1.Deployment, generation int64) error {
	redis := tp.Spec.Storage.Type == twv1alpha1.StorageRedis
	storage := tp.Spec.Storage.Type
	if storage == "" {
		storage = twv1alpha1.StorageMemory
	}
	inForce := g.divisor
	placement := fmt.Sprintf("memory storage: each of the %d replicas enforces 1/%d of it", g.divisor, g.divisor)
	if redis {
		inForce = 1
		placement = "Redis storage: the replicas share the fleet total"
	}
	readyMsg := fmt.Sprintf("In the fleet's config (generation %d); %s", generation, placement)

	var budgets twv1alpha1.TokenBudgetList
	if err := r.List(ctx, &budgets, client.InNamespace(tp.Namespace), client.MatchingFields{proxyRefField: tp.Name}); err != nil {
		return err
	}
	accepted := int32(0)
	for i := range budgets.Items {
		b := &budgets.Items[i]
		v, ok := g.budgetVerdicts[b.Name]
		if !ok {
			continue // created after this reconcile read the list: the next one covers it
		}
		st := b.Status.DeepCopy()
		st.ObservedGeneration = b.Generation
		st.Storage = storage
		if v.accepted {
			accepted++
			st.Replicas = inForce
			st.PerReplica = twv1alpha1.PerReplicaAllowance{
				TokensPerMinute: allowance(b.Spec.TokensPerMinute, inForce),
				TokensPerDay:    allowance(b.Spec.TokensPerDay, inForce),
			}
			setCondition(&st.Conditions, twv1alpha1.ConditionAccepted, true, v.reason, v.message, b.Generation)
			setCondition(&st.Conditions, twv1alpha1.ConditionReady, true, twv1alpha1.ReasonRendered, readyMsg, b.Generation)
		} else {
			st.Replicas, st.PerReplica = 0, twv1alpha1.PerReplicaAllowance{}
			if !meta.IsStatusConditionPresentAndEqual(st.Conditions, twv1alpha1.ConditionAccepted, metav1.ConditionFalse) {
				r.Events.Eventf(b, tp, corev1.EventTypeWarning, v.reason, "Render", v.message)
			}
			setCondition(&st.Conditions, twv1alpha1.ConditionAccepted, false, v.reason, v.message, b.Generation)
			setCondition(&st.Conditions, twv1alpha1.ConditionReady, false, v.reason, "Not in the fleet's config: "+v.message, b.Generation)
		}
		if err := r.patchStatus(ctx, b, &b.Status, st); err != nil {
			return err
		}
	}

	var keys twv1alpha1.ApiKeyList
	if err := r.List(ctx, &keys, client.InNamespace(tp.Namespace), client.MatchingFields{proxyRefField: tp.Name}); err != nil {
		return err
	}
	keysIn := int32(0)
	for i := range keys.Items {
		k := &keys.Items[i]
		v, ok := g.keyVerdicts[k.Name]
		if !ok {
			continue
		}
		st := k.Status.DeepCopy()
		st.ObservedGeneration = k.Generation
		st.Fingerprint = g.fingerprints[k.Name]
		if v.accepted {
			keysIn++
			setCondition(&st.Conditions, twv1alpha1.ConditionAccepted, true, v.reason, v.message, k.Generation)
			setCondition(&st.Conditions, twv1alpha1.ConditionReady, true, twv1alpha1.ReasonRendered, fmt.Sprintf("In the fleet's config (generation %d)", generation), k.Generation)
		} else {
			if !meta.IsStatusConditionPresentAndEqual(st.Conditions, twv1alpha1.ConditionAccepted, metav1.ConditionFalse) {
				r.Events.Eventf(k, tp, corev1.EventTypeWarning, v.reason, "Render", v.message)
			}
			setCondition(&st.Conditions, twv1alpha1.ConditionAccepted, false, v.reason, v.message, k.Generation)
			setCondition(&st.Conditions, twv1alpha1.ConditionReady, false, v.reason, "Not in the fleet's config: "+v.message, k.Generation)
		}
		if err := r.patchStatus(ctx, k, &k.Status, st); err != nil {
			return err
		}
	}

	st := tp.Status.DeepCopy()
	st.ObservedGeneration = tp.Generation
	st.Replicas, st.ReadyReplicas = deploy.Status.Replicas, deploy.Status.ReadyReplicas
	sel, _ := metav1.LabelSelectorAsSelector(deploy.Spec.Selector)
	st.Selector = sel.String()
	st.Divisor, st.Storage, st.Budgets, st.Keys, st.ConfigGeneration = g.divisor, storage, accepted, keysIn, generation
	setCondition(&st.Conditions, twv1alpha1.ConditionAccepted, true, twv1alpha1.ReasonAccepted, "The fleet is rendered", tp.Generation)
	want := int32(1)
	if tp.Spec.Replicas != nil {
		want = *tp.Spec.Replicas
	}
	if deploy.Status.ReadyReplicas >= want && deploy.Status.UpdatedReplicas >= want {
		setCondition(&st.Conditions, twv1alpha1.ConditionReady, true, twv1alpha1.ReasonDeploymentReady,
			fmt.Sprintf("%d of %d proxies ready", deploy.Status.ReadyReplicas, want), tp.Generation)
	} else {
		setCondition(&st.Conditions, twv1alpha1.ConditionReady, false, twv1alpha1.ReasonNotReady,
			fmt.Sprintf("%d of %d proxies ready", deploy.Status.ReadyReplicas, want), tp.Generation)
	}
	return r.patchStatus(ctx, tp, &tp.Status, st)
}

// allowance is what each replica enforces of a fleet total: nil when unlimited.
func allowance(total, divisor int64) *int64 {
	a := budget.Divide(total, divisor)
	if !a.Limited() {
		return nil
	}
	n := a.Tokens()
	return &n
}
