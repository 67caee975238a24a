// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package controllers

import (
	"context"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	twv1alpha1 "github.com/tokenwarden/tokenwarden/api/v1alpha1"
	"github.com/tokenwarden/tokenwarden/controllers/render"
)

func setCondition(conds *[]metav1.Condition, typ string, ok bool, reason, msg string, generation int64) {
	status := metav1.ConditionFalse
	if ok {
		status = metav1.ConditionTrue
	}
	meta.SetStatusCondition(conds, metav1.Condition{Type: typ, Status: status, Reason: reason, Message: msg, ObservedGeneration: generation})
}

// writeProxyStatus writes st as the TokenProxy's status when it differs semantically
// from the status tp holds. It replaces the whole status (a conflict is retried by
// the next reconcile), so zero values such as readyReplicas: 0 are stored too. tp is
// not changed: a copy is written, and remembered until the cache holds it.
func (r *TokenProxyReconciler) writeProxyStatus(ctx context.Context, tp *twv1alpha1.TokenProxy, st *twv1alpha1.TokenProxyStatus) error {
	if equality.Semantic.DeepEqual(&tp.Status, st) {
		return nil
	}
	o := tp.DeepCopy()
	o.Status = *st
	if err := r.Status().Update(ctx, o); err != nil {
		return fmt.Errorf("patch status of %s: %w", o.Name, err)
	}
	// o holds the status as the API server answered it (times in whole seconds).
	r.ownStatuses.wrote(client.ObjectKeyFromObject(tp), tp.ResourceVersion, o.ResourceVersion, &o.Status)
	return nil
}

// queueBudgetStatus queues st as the TokenBudget's status, written by the fleet's
// status writer, when it differs semantically from the status b holds: a merge patch
// of what changed, because the usage controller writes status.usage concurrently
// (tokenbudget_usage.go), which must neither make this write conflict nor be
// overwritten by it. b, which may be the cache's own object (gather lists budgets
// without copies), is not changed; the queue holds the patch and the budget's name.
func (r *TokenProxyReconciler) queueBudgetStatus(fleet types.NamespacedName, b *twv1alpha1.TokenBudget, st *twv1alpha1.TokenBudgetStatus) {
	k := statusKey{kind: budgetStatus, name: client.ObjectKeyFromObject(b)}
	if equality.Semantic.DeepEqual(&b.Status, st) {
		r.statuses.cancel(fleet, k)
		return
	}
	data, err := client.MergeFrom(&twv1alpha1.TokenBudget{Status: b.Status}).Data(&twv1alpha1.TokenBudget{Status: *st})
	if err != nil {
		// Statuses always encode; a write of the whole budget would do no better.
		log.Log.Error(err, "Unable to diff a TokenBudget's status", "budget", k.name)
		return
	}
	r.statuses.enqueue(k, &pendingStatus{fleet: fleet, patch: data, first: firstStatus(b.Generation, b.Status.ObservedGeneration)})
}

// queueKeyStatus queues st as the ApiKey's status, computed from the inputs of digest
// in (0: from nothing a reconcile remembers), when it differs semantically from the status k
// holds; the write replaces the whole status, and conflicts when the key changed
// since k was read. k, which may be the cache's own object, is not changed. The queue
// holds st, its repeated strings shared, and the key's resourceVersion alone: the
// status subresource takes nothing else from a write, so a burst's backlog of
// thousands of statuses holds no copy of their keys.
func (r *TokenProxyReconciler) queueKeyStatus(fleet types.NamespacedName, k *twv1alpha1.ApiKey, st *twv1alpha1.ApiKeyStatus, in inputsDigest) {
	sk := statusKey{kind: keyStatus, name: client.ObjectKeyFromObject(k)}
	if equality.Semantic.DeepEqual(&k.Status, st) {
		r.statuses.cancel(fleet, sk)
		return
	}
	shareConditionStrings(st.Conditions)
	r.statuses.enqueue(sk, &pendingStatus{fleet: fleet, status: st, resourceVersion: k.ResourceVersion, inputs: in,
		first: firstStatus(k.Generation, k.Status.ObservedGeneration)})
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
func (r *TokenProxyReconciler) fleetStatus(s *fleetScope, rs *reports) *twv1alpha1.TokenProxyStatus {
	tp, g, cfg, deploy := s.tp, s.gathered, s.cfg, s.deploy
	st := tp.Status.DeepCopy()
	st.ObservedGeneration = tp.Generation
	st.Storage = storageOf(tp)
	setTenancy(st, tp)
	hasLedger := render.EffectiveLedger(tp, r.DefaultLedger) != nil
	setLedgerFallback(st, tp, hasLedger)
	if cfg.refused != nil {
		r.refuseConfig(tp, &st.Conditions, cfg.refused)
	} else {
		r.setFleetAccepted(tp, &st.Conditions, g.credentials)
	}
	if cfg.written {
		st.Divisor, st.Budgets, st.Keys, st.ConfigGeneration = g.Divisor, 0, 0, cfg.generation
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
			note := setLedgerAttestation(st, rs, hasLedger)
			setFenced(st, rs, note, tp.Generation)
			setStoreChecks(st, rs, tp.Generation)
		} else {
			meta.RemoveStatusCondition(&st.Conditions, twv1alpha1.ConditionDurableBudgetsFenced)
			meta.RemoveStatusCondition(&st.Conditions, twv1alpha1.ConditionStoreChecksFailed)
		}
		setLedgerSpooling(st, rs, hasLedger, tp.Generation)
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
	r.setDegraded(tp, &st.Conditions, &s.steps)
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

// reconcileStatuses queues the statuses of the fleet's budgets and keys when the
// config was written (their conditions name its generation), for the status writer,
// and writes the TokenProxy's. It returns when a replica's report Lease expires.
func (r *TokenProxyReconciler) reconcileStatuses(ctx context.Context, s *fleetScope) (time.Duration, error) {
	tp := s.tp
	now := time.Now()
	var rs *reports
	stale := false
	if s.cfg.written {
		var err error
		if rs, err = r.readReports(ctx, s, now); s.steps.record(stepStatus, err) {
			stale = r.queueObjectStatuses(s, rs)
		} else {
			rs = nil
		}
	}
	// A status write that failed since the last reconcile fails this one's Status step.
	s.steps.record(stepStatus, r.statuses.failure(client.ObjectKeyFromObject(tp)))
	st := r.fleetStatus(s, rs)
	// A newly recorded durable epoch goes into the config at once: the next reconcile
	// renders it.
	epochsChanged := !equality.Semantic.DeepEqual(st.DurableEpochs, tp.Status.DurableEpochs)
	r.eventLedgerAttestation(tp, tp.Status.DurableEpochs, st.DurableEpochs)
	if err := r.writeProxyStatus(ctx, tp, st); err != nil {
		return 0, err
	}
	if rs == nil {
		return 0, nil
	}
	if epochsChanged {
		return time.Millisecond, nil
	}
	d := rs.requeue(now)
	if stale && (d == 0 || d > staleRetry) {
		d = staleRetry
	}
	return d, nil
}

// staleRetry is how soon a fleet is reconciled again for a key whose status write
// its cache does not hold yet.
const staleRetry = 500 * time.Millisecond

// markProxyNotFound queues Accepted=False/ProxyNotFound as the status of the objects
// that reference a fleet that does not exist.
func (r *TokenProxyReconciler) markProxyNotFound(ctx context.Context, name types.NamespacedName) error {
	var budgets twv1alpha1.TokenBudgetList
	if err := r.List(ctx, &budgets, client.MatchingFields{proxyRefField: name.String()}); err != nil {
		return err
	}
	for i := range budgets.Items {
		b := &budgets.Items[i]
		st := b.Status.DeepCopy()
		st.Replicas, st.PerReplica, st.Storage = 0, twv1alpha1.PerReplicaAllowance{}, ""
		st.Summary = render.Summary(nil, b, false, 1)
		proxyNotFound(b, name, &st.ObservedGeneration, &st.ConfigGeneration, &st.Conditions)
		r.queueBudgetStatus(name, b, st)
	}
	var keys twv1alpha1.ApiKeyList
	if err := r.List(ctx, &keys, client.MatchingFields{proxyRefField: name.String()}); err != nil {
		return err
	}
	for i := range keys.Items {
		k := &keys.Items[i]
		st := k.Status.DeepCopy()
		proxyNotFound(k, name, &st.ObservedGeneration, &st.ConfigGeneration, &st.Conditions)
		r.queueKeyStatus(name, k, st, 0)
	}
	log.FromContext(ctx).V(1).Info("TokenProxy not found; marking its references", "budgets", len(budgets.Items), "keys", len(keys.Items))
	return nil
}

// proxyNotFound sets what a missing fleet means in the status of a budget or key
// that references it: its generation observed, in no config, and Accepted, Ready
// and Enforced False. An object in another namespace is told the fleet's namespace too.
func proxyNotFound(o client.Object, fleet types.NamespacedName, observed, configGen *int64, conds *[]metav1.Condition) {
	msg := fmt.Sprintf("TokenProxy %s not found", fleet.Name)
	if render.Foreign(o) {
		msg = fmt.Sprintf("TokenProxy %s not found", fleet)
	}
	gen := o.GetGeneration()
	*observed, *configGen = gen, 0
	setCondition(conds, twv1alpha1.ConditionAccepted, false, twv1alpha1.ReasonProxyNotFound, msg, gen)
	setCondition(conds, twv1alpha1.ConditionReady, false, twv1alpha1.ReasonProxyNotFound, msg, gen)
	setCondition(conds, twv1alpha1.ConditionEnforced, false, twv1alpha1.ReasonNotInConfig, "Not in a fleet's config: "+msg, gen)
}
