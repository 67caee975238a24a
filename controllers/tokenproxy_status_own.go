// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package controllers

import (
	"sync"

	"k8s.io/apimachinery/pkg/types"

	twv1alpha1 "github.com/tokenwarden/tokenwarden/api/v1alpha1"
)

// ownStatuses remembers, per fleet, the TokenProxy status the reconciler wrote last,
// so that a reconcile that reads the fleet from a cache not yet holding that write
// works from it, instead of computing from the status it replaced and failing its
// own write with a conflict (and reconciling the whole fleet again).
type ownStatuses struct {
	mu sync.Mutex
	m  map[types.NamespacedName]ownStatus
}

// ownStatus is one status write: the resourceVersion it replaced, the one it made,
// and the status written.
type ownStatus struct {
	replaced, written string
	status            twv1alpha1.TokenProxyStatus
}

// wrote records that status, as the API server answered the write, replaced the
// version replaced and made the version written.
func (o *ownStatuses) wrote(fleet types.NamespacedName, replaced, written string, status *twv1alpha1.TokenProxyStatus) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.m == nil {
		o.m = map[types.NamespacedName]ownStatus{}
	}
	o.m[fleet] = ownStatus{replaced: replaced, written: written, status: *status.DeepCopy()}
}

// overlay puts the last status written into tp when tp is the version that write
// replaced: the cache has not caught up with it. Any other version forgets the write
// (the cache holds it, or something else changed the object since).
func (o *ownStatuses) overlay(tp *twv1alpha1.TokenProxy) {
	fleet := types.NamespacedName{Namespace: tp.Namespace, Name: tp.Name}
	o.mu.Lock()
	defer o.mu.Unlock()
	w, there := o.m[fleet]
	if !there {
		return
	}
	if w.replaced != tp.ResourceVersion {
		delete(o.m, fleet)
		return
	}
	tp.ResourceVersion = w.written
	tp.Status = *w.status.DeepCopy()
}

// forget drops a fleet that is gone.
func (o *ownStatuses) forget(fleet types.NamespacedName) {
	o.mu.Lock()
	defer o.mu.Unlock()
	delete(o.m, fleet)
}
