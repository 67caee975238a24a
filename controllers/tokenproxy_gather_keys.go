// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package controllers

import (
	"context"
	"fmt"
	"slices"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	twv1alpha1 "github.com/tokenwarden/tokenwarden/api/v1alpha1"
)

// A fleet of 50,000 keys is read on every reconcile (issue 14). Listed through the
// client, the cache copies every ApiKey and Secret struct into a list (about 40 MB at
// that size, a reconcile in flight), and the keys were sorted anew each time. So the
// reconciler reads the cache's own objects from the informers' indexes, without a
// copy, and keeps each fleet's name order between reconciles: a reconcile whose keys
// are the ones of the last (whatever their content) places each in its slot without
// sorting, and a key added or deleted is merged into the order.

// indexers are the informers' indexes the reconciler reads without copies; nil
// members are read through the client.
type indexers struct {
	keys    toolscache.Indexer
	secrets toolscache.Indexer
	// keySecrets is true when keys has the index of ApiKeys by their Secret
	// (tokenproxy_watches_secrets.go).
	keySecrets bool
}

// indexerOf returns the index of the cache's informer for obj, nil when the cache
// has none to give.
func indexerOf(ctx context.Context, mgr ctrl.Manager, obj client.Object) toolscache.Indexer {
	inf, err := mgr.GetCache().GetInformer(ctx, obj)
	if err != nil {
		return nil
	}
	if i, ok := inf.(interface{ GetIndexer() toolscache.Indexer }); ok {
		return i.GetIndexer()
	}
	return nil
}

// keyOrder is a fleet's ApiKeys in name order as the last reconcile read them.
type keyOrder struct {
	names []types.NamespacedName
	at    map[types.NamespacedName]int
}

// keyOrders holds each fleet's keyOrder, by TokenProxy namespace and name. A fleet
// is reconciled by one worker at a time, so each keyOrder is used by one at a time.
type keyOrders struct{ m sync.Map }

func (o *keyOrders) of(fleet types.NamespacedName) *keyOrder {
	v, _ := o.m.LoadOrStore(fleet, &keyOrder{at: map[types.NamespacedName]int{}})
	return v.(*keyOrder)
}

func (o *keyOrders) forget(fleet types.NamespacedName) { o.m.Delete(fleet) }

// sorted returns objs, the fleet's ApiKeys in any order, in the order of their
// render.ObjectKey, and remembers that order.
func (o *keyOrder) sorted(objs []*twv1alpha1.ApiKey) []*twv1alpha1.ApiKey {
	out := make([]*twv1alpha1.ApiKey, len(o.names))
	var added []*twv1alpha1.ApiKey
	placed := 0
	for _, k := range objs {
		i, ok := o.at[types.NamespacedName{Namespace: k.Namespace, Name: k.Name}]
		if !ok || out[i] != nil {
			added = append(added, k)
			continue
		}
		out[i] = k
		placed++
	}
	if len(added) == 0 && placed == len(o.names) {
		return out
	}
	// Keys were added or deleted: merge what is left of the order with the new keys.
	kept := slices.DeleteFunc(out, func(k *twv1alpha1.ApiKey) bool { return k == nil })
	slices.SortFunc(added, compareKeys)
	merged := make([]*twv1alpha1.ApiKey, 0, len(kept)+len(added))
	i, j := 0, 0
	for i < len(kept) || j < len(added) {
		if j == len(added) || (i < len(kept) && compareKeys(kept[i], added[j]) <= 0) {
			merged = append(merged, kept[i])
			i++
			continue
		}
		merged = append(merged, added[j])
		j++
	}
	o.names = o.names[:0]
	clear(o.at)
	for n, k := range merged {
		nn := types.NamespacedName{Namespace: k.Namespace, Name: k.Name}
		o.names = append(o.names, nn)
		o.at[nn] = n
	}
	return merged
}

func compareKeys(a, b *twv1alpha1.ApiKey) int {
	return compareJoined(a.Namespace, a.Name, b.Namespace, b.Name)
}

// fleetKeys returns the ApiKeys that reference the fleet, in the order of their
// render.ObjectKey, as the cache holds them: not to be written to.
func (r *TokenProxyReconciler) fleetKeys(ctx context.Context, tp *twv1alpha1.TokenProxy) ([]*twv1alpha1.ApiKey, error) {
	fleet := client.ObjectKeyFromObject(tp)
	var objs []*twv1alpha1.ApiKey
	if r.indexes.keys != nil {
		// controller-runtime's field index of a cluster-wide list (cache_reader.go).
		items, err := r.indexes.keys.ByIndex("field:"+proxyRefField, "__all_namespaces/"+fleet.String())
		if err != nil {
			return nil, fmt.Errorf("list ApiKeys: %w", err)
		}
		objs = make([]*twv1alpha1.ApiKey, 0, len(items))
		for _, it := range items {
			k, ok := it.(*twv1alpha1.ApiKey)
			if !ok {
				return nil, fmt.Errorf("list ApiKeys: the cache holds a %T", it)
			}
			objs = append(objs, k)
		}
	} else {
		var keys twv1alpha1.ApiKeyList
		if err := r.List(ctx, &keys, client.MatchingFields{proxyRefField: fleet.String()}, client.UnsafeDisableDeepCopy); err != nil {
			return nil, fmt.Errorf("list ApiKeys: %w", err)
		}
		objs = make([]*twv1alpha1.ApiKey, len(keys.Items))
		for i := range keys.Items {
			objs[i] = &keys.Items[i]
		}
	}
	return r.keyOrders.of(fleet).sorted(objs), nil
}

// apiKeySecret returns the Secret of a namespace labelled for ApiKeys, as the cache
// holds it (not to be written to), or nil when there is none of that name. secrets
// is the fallback read through the client, by namespace and name.
func (r *TokenProxyReconciler) apiKeySecret(ctx context.Context, namespace, name string,
	listed map[string]map[string]*corev1.Secret,
) (*corev1.Secret, error) {
	if r.indexes.secrets != nil {
		it, found, err := r.indexes.secrets.GetByKey(namespace + "/" + name)
		if err != nil {
			return nil, fmt.Errorf("get Secret %s/%s: %w", namespace, name, err)
		}
		s, ok := it.(*corev1.Secret)
		if !found || !ok || s.Labels[twv1alpha1.SecretUsageLabel] != twv1alpha1.SecretUsageAPIKey {
			return nil, nil
		}
		return s, nil
	}
	inNS, ok := listed[namespace]
	if !ok {
		var err error
		if inNS, err = r.apiKeySecrets(ctx, namespace); err != nil {
			return nil, err
		}
		listed[namespace] = inNS
	}
	return inNS[name], nil
}
