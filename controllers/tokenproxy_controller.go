// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package controllers

import (
	"context"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	twv1alpha1 "github.com/tokenwarden/tokenwarden/api/v1alpha1"
	"github.com/tokenwarden/tokenwarden/controllers/render"
)

// Field indexes.
const (
	// proxyRefField indexes TokenBudgets and ApiKeys by their fleet: "namespace/name".
	proxyRefField = "spec.proxyRef"
)

// TokenProxyReconciler runs one fleet per TokenProxy: it renders the fleet's
// TokenBudgets and ApiKeys into the proxy config ConfigMap, runs the proxy Deployment,
// Service and RBAC, and writes the status of every object it read.
type TokenProxyReconciler struct {
	client.Client
	// Events records what an operator acts on: conflicts and missing Secrets.
	Events events.EventRecorder
	// ProxyImage is the proxy image when a TokenProxy names none.
	ProxyImage string
	// DefaultTracing is the tracing of a fleet whose TokenProxy sets none; nil: off.
	DefaultTracing *twv1alpha1.TracingSpec
	// DefaultLedger is the ledger of a fleet whose TokenProxy names no URL Secret (its
	// Secret is looked up in the fleet's namespace); nil: none.
	DefaultLedger *twv1alpha1.LedgerSpec

	// monitors says whether the cluster serves ServiceMonitors (checked at setup, and
	// again when their CRD appears).
	monitors monitors
	// UsageInterval is the shortest time between two writes of one TokenBudget's
	// status.usage (default DefaultUsageInterval).
	UsageInterval time.Duration
	// StatusWritesPerSecond bounds the TokenBudget and ApiKey status writes of every
	// fleet together (default DefaultStatusWritesPerSecond); StatusWriters is how many
	// run at once (default DefaultStatusWriters).
	StatusWritesPerSecond float32
	StatusWriters         int

	// statuses writes the TokenBudgets' and ApiKeys' statuses the reconciles compute
	// (tokenproxy_status_writer.go).
	statuses *statusWriter

	// renewals tells live replicas by the renewals the operator saw (tokenproxy_status_reports.go).
	renewals renewals
	// keyStatuses memoizes, per fleet (by TokenProxy namespace and name), the inputs of the key
	// statuses found current (keyStatusInputs).
	keyStatuses sync.Map
	// apiReader reads what the cache does not hold: a ConfigMap the operator did not
	// label, in the way of a config chunk (createChunk).
	apiReader client.Reader
	// indexes are the informers' indexes of ApiKeys and their Secrets, read without
	// copies; keyOrders is each fleet's key order (tokenproxy_gather_keys.go).
	indexes   indexers
	keyOrders keyOrders
	// configs is each fleet's last config outcome and its inputs (tokenproxy_config_memo.go).
	configs configMemos
	// layouts is each fleet's chunked document, key by key (tokenproxy_config_layout.go).
	layouts render.DocLayouts
	// scales serializes the writes of each fleet's Deployment's replicas (tokenproxy_scale.go).
	scales scaleLocks
	// ownStatuses is each fleet's last TokenProxy status write (tokenproxy_status_own.go).
	ownStatuses ownStatuses
}

// SetupWithManager registers the reconciler, its indexes and its watches.
func (r *TokenProxyReconciler) SetupWithManager(ctx context.Context, mgr ctrl.Manager) error {
	r.apiReader = mgr.GetAPIReader()
	r.statuses = newStatusWriter(r.Client, r.StatusWritesPerSecond, r.StatusWriters)
	if err := mgr.Add(r.statuses); err != nil {
		return err
	}
	idx := mgr.GetFieldIndexer()
	if err := idx.IndexField(ctx, &twv1alpha1.TokenBudget{}, proxyRefField, proxyRefIndex); err != nil {
		return err
	}
	if err := idx.IndexField(ctx, &twv1alpha1.ApiKey{}, proxyRefField, proxyRefIndex); err != nil {
		return err
	}
	if err := idx.IndexField(ctx, &twv1alpha1.TokenProxy{}, credentialSecretField, r.credentialSecretNames); err != nil {
		return err
	}
	r.indexes = indexers{keys: indexerOf(ctx, mgr, &twv1alpha1.ApiKey{}), secrets: indexerOf(ctx, mgr, &corev1.Secret{})}
	if r.indexes.keys != nil {
		r.indexes.keySecrets = r.indexes.keys.AddIndexers(keySecretIndexers) == nil
	}
	toProxy := func(_ context.Context, o client.Object) []reconcile.Request {
		return []reconcile.Request{{NamespacedName: render.ProxyOf(o)}}
	}
	b := ctrl.NewControllerManagedBy(mgr).
		For(&twv1alpha1.TokenProxy{}).
		Owns(&corev1.ConfigMap{}).
		Owns(&appsv1.Deployment{}).
		Owns(&corev1.Service{}).
		Owns(&policyv1.PodDisruptionBudget{}).
		Owns(&networkingv1.NetworkPolicy{})
	r.monitors.mapper = mgr.GetRESTMapper()
	if r.monitors.served = serviceMonitorInstalled(mgr.GetRESTMapper()); r.monitors.served {
		b = b.Owns(newServiceMonitor())
		r.monitors.started = true
	}
	c, err := b.
		Watches(crdEvents(), handler.EnqueueRequestsFromMapFunc(r.proxiesWantingMonitors),
			builder.WithPredicates(predicate.NewPredicateFuncs(func(o client.Object) bool { return o.GetName() == serviceMonitorCRD }))).
		Watches(&twv1alpha1.TokenBudget{}, handler.EnqueueRequestsFromMapFunc(toProxy),
			builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Watches(&twv1alpha1.ApiKey{}, handler.EnqueueRequestsFromMapFunc(toProxy),
			builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Watches(&corev1.Secret{}, handler.EnqueueRequestsFromMapFunc(r.proxiesOfSecret), builder.WithPredicates(secretChanged())).
		Watches(&corev1.Namespace{}, handler.EnqueueRequestsFromMapFunc(r.proxiesOfNamespace),
			builder.WithPredicates(predicate.LabelChangedPredicate{})).
		Watches(&coordinationv1.Lease{}, handler.EnqueueRequestsFromMapFunc(r.proxyOfLease),
			builder.WithPredicates(leaseReportChanged())).
		Watches(&rbacv1.ClusterRoleBinding{}, handler.EnqueueRequestsFromMapFunc(r.orphanedAuthDelegator),
			builder.WithPredicates(bindingListed())).
		WatchesRawSource(r.statuses.source()).
		Build(r)
	if err != nil {
		return err
	}
	if err := r.setupScaler(mgr); err != nil {
		return err
	}
	if err := r.setupUsage(mgr); err != nil {
		return err
	}
	r.monitors.watch = func() error {
		return c.Watch(source.Kind(mgr.GetCache(), client.Object(newServiceMonitor()),
			handler.EnqueueRequestForOwner(mgr.GetScheme(), mgr.GetRESTMapper(), &twv1alpha1.TokenProxy{}, handler.OnlyControllerOwner())))
	}
	return nil
}

// Reconcile renders one fleet, runs its objects, writes its TokenProxy's status and
// queues the status of everything else it read for the status writer, so that it
// returns without waiting for them: a scale is never held up behind a burst of status
// writes. Each step runs unless a step it depends on failed; a failed step sets
// Degraded and the request is retried with backoff.
func (r *TokenProxyReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var tp twv1alpha1.TokenProxy
	if err := r.Get(ctx, req.NamespacedName, &tp); err != nil {
		if apierrors.IsNotFound(err) {
			// The fleet is gone (its owned objects go with it, its cluster-scoped
			// binding is deleted here); tell the objects that still reference it.
			r.keyStatuses.Delete(req.NamespacedName)
			r.keyOrders.forget(req.NamespacedName)
			r.configs.forget(req.NamespacedName)
			r.layouts.Forget(req.NamespacedName)
			r.scales.forget(req.NamespacedName)
			r.ownStatuses.forget(req.NamespacedName)
			_ = r.statuses.failure(req.NamespacedName) // its objects' statuses are queued again below
			if err := r.deleteAuthDelegator(ctx, req.NamespacedName); err != nil {
				return ctrl.Result{}, err
			}
			return ctrl.Result{}, r.markProxyNotFound(ctx, req.NamespacedName)
		}
		return ctrl.Result{}, err
	}
	r.ownStatuses.overlay(&tp)
	if !tp.DeletionTimestamp.IsZero() {
		return ctrl.Result{}, nil
	}

	g, err := r.gather(ctx, &tp)
	if err != nil {
		// Nothing can be rendered from what could not be read; say so.
		return ctrl.Result{}, r.reportUnread(ctx, &tp, err)
	}
	s := &fleetScope{tp: &tp, gathered: g}
	r.reconcileConfig(ctx, s)
	r.reconcileWorkload(ctx, s)
	s.steps.record(stepServiceMonitor, r.applyServiceMonitor(ctx, &tp))
	requeue, err := r.reconcileStatuses(ctx, s)
	if err != nil {
		return ctrl.Result{}, err
	}
	if err := s.steps.err(); err != nil {
		return ctrl.Result{}, err
	}
	// A live replica's Lease that is not renewed expires then: time-driven work.
	return ctrl.Result{RequeueAfter: requeue}, nil
}

// fleetScope is one reconcile of one fleet, which its phases read and fill in the
// order Reconcile runs them: gather, config, workload, ServiceMonitor, statuses (queued).
type fleetScope struct {
	tp *twv1alpha1.TokenProxy
	// gathered is what the fleet is made of, and every object's verdict.
	*gathered
	// cfg is what the config step left.
	cfg configOutcome
	// deploy is the Deployment as the workload step applied it, or as read when
	// applying it failed; nil when there is none.
	deploy *appsv1.Deployment
	// steps are the failures of the steps run so far.
	steps steps
}

// proxyName is the name of the fleet's owned objects.
func proxyName(tp *twv1alpha1.TokenProxy) string { return tp.Name + "-proxy" }
