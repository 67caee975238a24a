// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package controllers

import (
	"reflect"

	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	k8slabels "k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	twv1alpha1 "github.com/tokenwarden/tokenwarden/api/v1alpha1"
	"github.com/tokenwarden/tokenwarden/controllers/render"
)

// CacheOptions are the manager's cache options the reconciler needs (see also
// scopedCacheOptions): Leases only
// with the replicas' label, not every node heartbeat and leader election of the
// cluster.
func CacheOptions() cache.Options {
	req, err := k8slabels.NewRequirement(twv1alpha1.ReplicaConfigMapLabel, selection.Exists, nil)
	if err != nil {
		panic(err) // a constant, valid label key
	}
	return scopedCacheOptions(map[client.Object]cache.ByObject{
		&coordinationv1.Lease{}: {Label: k8slabels.NewSelector().Add(*req)},
	})
}

// scopedCacheOptions are the manager's cache options: Secrets only with
// SecretUsageLabel set to one of its values, owned objects only with the operator's
// label, and no managed fields, except on Deployments (applyDeployment compares the
// fields it owns, which it reads from them); ApiKey Secrets hold only hashes
// (slimSecret), config chunks only their text's hash (render.SlimConfigMap), and ApiKeys
// share their repeated strings (slimAPIKey). byObject adds the callers' selections.
func scopedCacheOptions(byObject map[client.Object]cache.ByObject) cache.Options {
	usage, err := k8slabels.NewRequirement(twv1alpha1.SecretUsageLabel, selection.In,
		[]string{twv1alpha1.SecretUsageAPIKey, twv1alpha1.SecretUsageCredential})
	if err != nil {
		panic(err) // constant, valid keys and values
	}
	owned := k8slabels.SelectorFromSet(k8slabels.Set{managedByLabel: fieldManager})
	set := func(o client.Object, b cache.ByObject) { setByObject(byObject, o, b) }
	set(&corev1.Secret{}, cache.ByObject{Label: k8slabels.NewSelector().Add(*usage), Transform: slimSecret})
	for _, o := range []client.Object{&corev1.Service{}, &corev1.ServiceAccount{},
		&rbacv1.Role{}, &rbacv1.RoleBinding{}, &policyv1.PodDisruptionBudget{}, &networkingv1.NetworkPolicy{}} {
		set(o, cache.ByObject{Label: owned})
	}
	set(&corev1.ConfigMap{}, cache.ByObject{Label: owned, Transform: render.SlimConfigMap})
	set(&twv1alpha1.ApiKey{}, cache.ByObject{Transform: slimAPIKey})
	set(&appsv1.Deployment{}, cache.ByObject{Label: owned, Transform: keepManagedFields})
	set(&rbacv1.ClusterRoleBinding{}, cache.ByObject{Label: owned})
	return cache.Options{ByObject: byObject, DefaultTransform: cache.TransformStripManagedFields()}
}

// setByObject sets o's type's selection in byObject, replacing any set for that type
// before. ByObject is keyed by pointer: of two keys of one type the cache keeps
// either, at random at each start (the chunks' text was cached at every other start).
func setByObject(byObject map[client.Object]cache.ByObject, o client.Object, b cache.ByObject) {
	for k := range byObject {
		if reflect.TypeOf(k) == reflect.TypeOf(o) {
			delete(byObject, k)
		}
	}
	byObject[o] = b
}

// keepManagedFields is the identity transform: it overrides the default one.
func keepManagedFields(o any) (any, error) { return o, nil }

var _ toolscache.TransformFunc = keepManagedFields
