// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package controllers

import (
	"context"
	"fmt"
	"slices"
	"strings"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	rbacv1ac "k8s.io/client-go/applyconfigurations/rbac/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	twv1alpha1 "github.com/tokenwarden/tokenwarden/api/v1alpha1"
)

// applyPodIdentity runs the pods' ServiceAccount and the Role that lets them read
// their own ConfigMap (and its chunks) and write their report Leases.
func (r *TokenProxyReconciler) applyPodIdentity(ctx context.Context, tp *twv1alpha1.TokenProxy, cfg configOutcome) error {
	name := proxyName(tp)
	own := func(o client.Object) error { return controllerutil.SetControllerReference(tp, o, r.Scheme()) }

	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: tp.Namespace}}
	if _, err := controllerutil.CreateOrUpdate(ctx, r.Client, sa, func() error {
		sa.Labels = labels(tp)
		return own(sa)
	}); err != nil {
		return fmt.Errorf("apply ServiceAccount: %w", err)
	}
	var chunks []string
	if cfg.written {
		chunks = cfg.chunks
	}
	if err := r.applyRole(ctx, tp, chunks, cfg.written); err != nil {
		return err
	}
	rb := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: tp.Namespace}}
	if _, err := controllerutil.CreateOrUpdate(ctx, r.Client, rb, func() error {
		rb.Labels = labels(tp)
		rb.RoleRef = rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: name}
		rb.Subjects = []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: name, Namespace: tp.Namespace}}
		return own(rb)
	}); err != nil {
		return fmt.Errorf("apply RoleBinding: %w", err)
	}
	// The pods' identity may ask the API server who calls their admin endpoints.
	return r.applyAuthDelegator(ctx, tp)
}

// applyRole runs the Role of the fleet's pods: get, list and watch on their
// ConfigMap, get on the chunks named (the current and the previous manifest's: see
// applyConfig), and their report Leases. Unless known, the chunks it names already
// are kept.
func (r *TokenProxyReconciler) applyRole(ctx context.Context, tp *twv1alpha1.TokenProxy, chunks []string, known bool) error {
	name := proxyName(tp)
	var leases coordinationv1.LeaseList
	if err := r.List(ctx, &leases, client.InNamespace(tp.Namespace),
		client.MatchingLabels{twv1alpha1.ReplicaConfigMapLabel: name}); err != nil {
		return fmt.Errorf("list report Leases: %w", err)
	}
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: tp.Namespace}}
	if _, err := controllerutil.CreateOrUpdate(ctx, r.Client, role, func() error {
		if !known {
			chunks = nil
			for _, rule := range role.Rules {
				if slices.Equal(rule.Resources, []string{"configmaps"}) && slices.Equal(rule.Verbs, []string{"get"}) {
					chunks = rule.ResourceNames
				}
			}
		}
		role.Labels = labels(tp)
		role.Rules = []rbacv1.PolicyRule{{
			APIGroups: []string{""}, Resources: []string{"configmaps"}, ResourceNames: []string{name},
			Verbs: []string{"get", "list", "watch"},
		}}
		if len(chunks) > 0 {
			// The chunks of a large fleet's config, by name: the proxy gets each one
			// its manifest names, and no other ConfigMap.
			role.Rules = append(role.Rules, rbacv1.PolicyRule{
				APIGroups: []string{""}, Resources: []string{"configmaps"}, ResourceNames: slices.Sorted(slices.Values(chunks)),
				Verbs: []string{"get"},
			})
		}
		role.Rules = append(role.Rules, rbacv1.PolicyRule{
			// Each replica creates its report Lease (proxy/report). Its name holds the
			// pod's name, unknown here, and RBAC cannot limit create by name.
			APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"},
			Verbs: []string{"create"},
		})
		// Renewing and deleting are granted by name, for the report Leases the fleet's
		// replicas created: a proxy cannot touch another Lease of its namespace (a
		// leader election's, say). The proxy never reads a Lease: it creates, then
		// patches.
		if names := reportLeaseNames(leases.Items, name); len(names) > 0 {
			role.Rules = append(role.Rules, rbacv1.PolicyRule{
				APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, ResourceNames: names,
				Verbs: []string{"patch", "delete"},
			})
		}
		return controllerutil.SetControllerReference(tp, role, r.Scheme())
	}); err != nil {
		return fmt.Errorf("apply Role: %w", err)
	}
	return nil
}

// reportLeaseNames are the names of the fleet's report Leases, sorted: Leases with the
// fleet's ConfigMap label whose name is the ConfigMap's followed by a replica's.
func reportLeaseNames(leases []coordinationv1.Lease, configMap string) []string {
	var names []string
	for _, le := range leases {
		if strings.HasPrefix(le.Name, configMap+"-") && le.DeletionTimestamp.IsZero() {
			names = append(names, le.Name)
		}
	}
	slices.Sort(names)
	return names
}

// authDelegatorRole is the built-in ClusterRole that lets its subjects create
// TokenReviews and SubjectAccessReviews, and nothing else.
const authDelegatorRole = "system:auth-delegator"

// authDelegatorPrefix begins the name of every fleet's auth-delegator binding.
const authDelegatorPrefix = "tokenwarden-proxy:"

// authDelegatorBinding names the ClusterRoleBinding of a fleet's ServiceAccount to
// system:auth-delegator.
func authDelegatorBinding(fleet types.NamespacedName) string {
	return authDelegatorPrefix + fleet.Namespace + ":" + fleet.Name
}

// fleetOfAuthDelegator is the fleet an auth-delegator binding was made for, read
// from its name (neither a namespace nor a TokenProxy name holds a colon).
func fleetOfAuthDelegator(name string) (types.NamespacedName, bool) {
	rest, ok := strings.CutPrefix(name, authDelegatorPrefix)
	if !ok {
		return types.NamespacedName{}, false
	}
	ns, fleet, ok := strings.Cut(rest, ":")
	if !ok || ns == "" || fleet == "" || strings.Contains(fleet, ":") {
		return types.NamespacedName{}, false
	}
	return types.NamespacedName{Namespace: ns, Name: fleet}, true
}

// orphanedAuthDelegator maps a binding whose TokenProxy is gone to its fleet, whose
// reconcile then deletes it (the NotFound path). The cache lists every labelled
// binding when the manager starts and again on each resync, so a TokenProxy deleted
// while the operator was not running loses its binding then. A fleet that exists
// keeps its binding through its own reconciles.
func (r *TokenProxyReconciler) orphanedAuthDelegator(ctx context.Context, o client.Object) []reconcile.Request {
	fleet, ok := fleetOfAuthDelegator(o.GetName())
	if !ok {
		return nil
	}
	if err := r.Get(ctx, fleet, &twv1alpha1.TokenProxy{}); !apierrors.IsNotFound(err) {
		return nil
	}
	log.FromContext(ctx).V(1).Info("ClusterRoleBinding of a TokenProxy that is gone", "binding", o.GetName(), "fleet", fleet)
	return []reconcile.Request{{NamespacedName: fleet}}
}

// bindingListed passes a binding the cache adds (every one when the manager starts)
// or lists again on a resync (an update that changes nothing); not a change or a
// deletion.
func bindingListed() predicate.Funcs {
	return predicate.Funcs{
		UpdateFunc: func(e event.UpdateEvent) bool {
			return e.ObjectOld.GetResourceVersion() == e.ObjectNew.GetResourceVersion()
		},
		DeleteFunc:  func(event.DeleteEvent) bool { return false },
		GenericFunc: func(event.GenericEvent) bool { return false },
	}
}

// applyAuthDelegator lets the fleet's ServiceAccount review the bearer tokens of its
// admin API's callers (proxy/adminauth: a TokenReview, then a SubjectAccessReview),
// reviews being cluster-scoped: a ClusterRoleBinding to system:auth-delegator. A
// cluster-scoped object cannot be owned by a namespaced one, so it is applied (server
// side, no cache of every ClusterRoleBinding) and deleted with the TokenProxy by
// deleteAuthDelegator, or later by the sweep of orphanedAuthDelegator.
func (r *TokenProxyReconciler) applyAuthDelegator(ctx context.Context, tp *twv1alpha1.TokenProxy) error {
	// An unchanged fleet sends no write: the binding in the cache already says it all.
	var have rbacv1.ClusterRoleBinding
	err := r.Get(ctx, client.ObjectKey{Name: authDelegatorBinding(client.ObjectKeyFromObject(tp))}, &have)
	if err == nil && have.RoleRef.Kind == "ClusterRole" && have.RoleRef.Name == authDelegatorRole &&
		len(have.Subjects) == 1 && have.Subjects[0].Kind == rbacv1.ServiceAccountKind &&
		have.Subjects[0].Namespace == tp.Namespace && have.Subjects[0].Name == proxyName(tp) &&
		have.Labels[fleetNamespaceLabel] == tp.Namespace {
		return nil
	}
	ac := rbacv1ac.ClusterRoleBinding(authDelegatorBinding(client.ObjectKeyFromObject(tp))).
		WithLabels(labels(tp)).WithLabels(map[string]string{fleetNamespaceLabel: tp.Namespace}).
		WithRoleRef(rbacv1ac.RoleRef().WithAPIGroup(rbacv1.GroupName).WithKind("ClusterRole").WithName(authDelegatorRole)).
		WithSubjects(rbacv1ac.Subject().WithKind(rbacv1.ServiceAccountKind).WithNamespace(tp.Namespace).WithName(proxyName(tp)))
	if err := r.Apply(ctx, ac, client.FieldOwner(fieldManager), client.ForceOwnership); err != nil {
		return fmt.Errorf("apply ClusterRoleBinding %s: %w", authDelegatorBinding(client.ObjectKeyFromObject(tp)), err)
	}
	return nil
}

// fleetNamespaceLabel on a fleet's cluster-scoped objects names its namespace.
const fleetNamespaceLabel = "tokenwarden.io/fleet-namespace"

// deleteAuthDelegator deletes the ClusterRoleBinding of a fleet that is gone.
func (r *TokenProxyReconciler) deleteAuthDelegator(ctx context.Context, fleet types.NamespacedName) error {
	crb := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: authDelegatorBinding(fleet)}}
	if err := r.Delete(ctx, crb); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete ClusterRoleBinding %s: %w", crb.Name, err)
	}
	return nil
}
