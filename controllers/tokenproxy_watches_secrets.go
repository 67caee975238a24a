// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package controllers

import (
	"context"
	"hash/fnv"
	"maps"
	"slices"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	twv1alpha1 "github.com/tokenwarden/tokenwarden/api/v1alpha1"
	"github.com/tokenwarden/tokenwarden/controllers/render"
)

// A Secret labelled for ApiKeys used to reconcile every fleet that may hold a key of
// its namespace, each visiting every one of its keys, and so did every update of such
// a Secret that changed nothing the operator reads (issue 14). Now a Secret is mapped
// to the ApiKeys that reference it, by an index of the ApiKey informer, and only then
// to their fleets; and an update that changes neither the Secret's data, as the cache
// holds it (the hashes of its values, slimSecret), nor its labels reconciles nothing.
//
// The index files each key under its namespace and a bucket of its Secret's name, not
// under the name itself: the informer's index holds a set for each value, and a set
// for each key (every key has a Secret of its own) cost about 0.45 KiB a key, 22 MB at
// 50,000 keys. With keySecretBuckets buckets a namespace's sets are few, and a
// Secret's event reads the keys of one bucket (about 50 at 50,000 keys) and keeps
// those that reference it.

// keySecretIndex indexes ApiKeys by "namespace/bucket" of the Secret they reference.
const keySecretIndex = "tokenwarden.io/key-secret-bucket"

// keySecretBuckets is how many buckets of Secret names a namespace's keys are indexed in.
const keySecretBuckets = 1024

// keySecretIndexers is the index of ApiKeys by their Secret's bucket.
var keySecretIndexers = toolscache.Indexers{keySecretIndex: func(o any) ([]string, error) {
	k, ok := o.(*twv1alpha1.ApiKey)
	if !ok || k.Spec.SecretRef.Name == "" {
		return nil, nil
	}
	return []string{keySecretBucket(k.Namespace, k.Spec.SecretRef.Name)}, nil
}}

// keySecretBucket is the index value of the Secret namespace/name: its namespace and
// the bucket of its name.
func keySecretBucket(namespace, name string) string {
	h := fnv.New32a()
	_, _ = h.Write([]byte(name))
	return namespace + "/" + strconv.FormatUint(uint64(h.Sum32()%keySecretBuckets), 10)
}

// fleetsOfKeySecret returns the fleets of the ApiKeys that reference the Secret
// namespace/name, and ok false when the index is not at hand (the caller then
// reconciles every fleet that may hold such a key).
func (r *TokenProxyReconciler) fleetsOfKeySecret(namespace, name string) (out []reconcile.Request, ok bool) {
	if r.indexes.keys == nil || !r.indexes.keySecrets {
		return nil, false
	}
	objs, err := r.indexes.keys.ByIndex(keySecretIndex, keySecretBucket(namespace, name))
	if err != nil {
		return nil, false
	}
	for _, o := range objs {
		k, isKey := o.(*twv1alpha1.ApiKey)
		if !isKey || k.Spec.SecretRef.Name != name {
			continue
		}
		req := reconcile.Request{NamespacedName: render.ProxyOf(k)}
		if !slices.Contains(out, req) {
			out = append(out, req)
		}
	}
	return out, true
}

// secretChanged passes a Secret's create and delete events, and its updates that
// change its data or its labels: what the operator reads of it.
func secretChanged() predicate.Predicate {
	return predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
		o, okOld := e.ObjectOld.(*corev1.Secret)
		n, okNew := e.ObjectNew.(*corev1.Secret)
		if !okOld || !okNew {
			return true
		}
		return !maps.Equal(o.Labels, n.Labels) || !equality.Semantic.DeepEqual(o.Data, n.Data) ||
			!maps.Equal(o.StringData, n.StringData) || o.Type != n.Type || !n.DeletionTimestamp.IsZero()
	}}
}

// proxiesOfSecret maps a Secret to the fleets whose pods read a credential from it
// and, for a Secret labelled for ApiKeys, to the fleets of the ApiKeys that reference
// it (keySecretIndexers). Without that index, such a Secret maps to every fleet that may
// hold an ApiKey of its namespace: the fleets of that namespace and those that accept
// other namespaces.
func (r *TokenProxyReconciler) proxiesOfSecret(ctx context.Context, o client.Object) []reconcile.Request {
	var proxies twv1alpha1.TokenProxyList
	if err := r.List(ctx, &proxies, client.InNamespace(o.GetNamespace()), client.MatchingFields{credentialSecretField: o.GetName()}); err != nil {
		return nil
	}
	var out []reconcile.Request
	for _, p := range proxies.Items {
		out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&p)})
	}
	if o.GetLabels()[twv1alpha1.SecretUsageLabel] != twv1alpha1.SecretUsageAPIKey {
		return out
	}
	if fleets, ok := r.fleetsOfKeySecret(o.GetNamespace(), o.GetName()); ok {
		for _, req := range fleets {
			if !slices.Contains(out, req) {
				out = append(out, req)
			}
		}
		return out
	}
	var all twv1alpha1.TokenProxyList
	if err := r.List(ctx, &all); err != nil {
		return out
	}
	for i := range all.Items {
		p := &all.Items[i]
		if p.Namespace != o.GetNamespace() && p.Spec.AllowedNamespaces.From != twv1alpha1.NamespacesFromAll &&
			p.Spec.AllowedNamespaces.From != twv1alpha1.NamespacesFromSelector {
			continue
		}
		if req := (reconcile.Request{NamespacedName: client.ObjectKeyFromObject(p)}); !slices.Contains(out, req) {
			out = append(out, req)
		}
	}
	return out
}
