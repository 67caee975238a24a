// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package controllers

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	twv1alpha1 "github.com/tokenwarden/tokenwarden/api/v1alpha1"
)

// A reconcile that reads the fleet from a cache still at the version its own last
// status write replaced works from that write: its next write carries the version
// the write made (no conflict) and compares against the status written.
func TestOwnStatusesOverlay(t *testing.T) {
	var o ownStatuses
	fleet := types.NamespacedName{Namespace: "ns", Name: "fleet"}
	cached := func(rv string) *twv1alpha1.TokenProxy {
		return &twv1alpha1.TokenProxy{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "fleet", ResourceVersion: rv},
			Status: twv1alpha1.TokenProxyStatus{ReadyReplicas: 1}}
	}
	written := &twv1alpha1.TokenProxyStatus{ReadyReplicas: 3}
	o.wrote(fleet, "10", "11", written)
	written.ReadyReplicas = 4 // the caller's status is copied

	stale := cached("10")
	o.overlay(stale)
	if stale.ResourceVersion != "11" || stale.Status.ReadyReplicas != 3 {
		t.Fatalf("the cache at the replaced version: got version %s, readyReplicas %d; want 11 and 3",
			stale.ResourceVersion, stale.Status.ReadyReplicas)
	}
	stale.Status.ReadyReplicas = 5
	again := cached("10")
	o.overlay(again)
	if again.Status.ReadyReplicas != 3 {
		t.Fatalf("a reconcile changed the remembered status: readyReplicas %d", again.Status.ReadyReplicas)
	}

	caughtUp := cached("11")
	o.overlay(caughtUp)
	if caughtUp.ResourceVersion != "11" || caughtUp.Status.ReadyReplicas != 1 {
		t.Fatalf("the cache holding the write is read as it is: got %s, %d", caughtUp.ResourceVersion, caughtUp.Status.ReadyReplicas)
	}
	late := cached("10")
	o.overlay(late)
	if late.ResourceVersion != "10" {
		t.Fatal("a write the cache has caught up with is forgotten")
	}
}
