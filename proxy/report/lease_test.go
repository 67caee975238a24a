// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package report

import (
	"context"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

// TestLease walks a replica's report: nothing before the first config, the Lease at
// once after it (owned by the ConfigMap, so it goes with the fleet), the new
// generation at once after the next, gone after a clean stop.
func TestLease(t *testing.T) {
	cs := fake.NewClientset(&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "fleet-proxy", Namespace: "llm", UID: "cm-uid"}})
	l := &Lease{Client: cs, Namespace: "llm", ConfigMap: "fleet-proxy", Replica: "fleet-proxy-abc", Renew: time.Hour}
	get := func() (*coordinationv1.Lease, error) {
		return cs.CoordinationV1().Leases("llm").Get(context.Background(), "fleet-proxy-fleet-proxy-abc", metav1.GetOptions{})
	}
	waitFor := func(what string, ok func(*coordinationv1.Lease, error) bool) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for {
			le, err := get()
			if ok(le, err) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: lease %+v, error %v", what, le, err)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); l.Run(ctx) }()

	time.Sleep(50 * time.Millisecond)
	if _, err := get(); !apierrors.IsNotFound(err) {
		t.Fatalf("a Lease before the first config: %v", err)
	}

	l.Applied(3, "d3")
	waitFor("the first config", func(le *coordinationv1.Lease, err error) bool {
		return err == nil && le.Annotations[GenerationAnnotation] == "3" && le.Annotations[DigestAnnotation] == "d3" &&
			le.Labels[ConfigMapLabel] == "fleet-proxy" && *le.Spec.HolderIdentity == "fleet-proxy-abc" &&
			len(le.OwnerReferences) == 1 && le.OwnerReferences[0].UID == "cm-uid" && le.OwnerReferences[0].Kind == "ConfigMap" &&
			*le.Spec.LeaseDurationSeconds == 15 && le.Spec.RenewTime != nil
	})

	// The renewal tick is an hour: only Applied can write generation 4 this soon.
	l.Applied(4, "d4")
	waitFor("the next config", func(le *coordinationv1.Lease, err error) bool {
		return err == nil && le.Annotations[GenerationAnnotation] == "4" && le.Annotations[DigestAnnotation] == "d4"
	})

	cancel()
	<-done
	if _, err := get(); !apierrors.IsNotFound(err) {
		t.Fatalf("the Lease after a clean stop: %v", err)
	}
}

// TestLeaseEpochs: the durable epochs are reported with the config, and a change to
// them (a fence) is written at once, not at the next renewal.
func TestLeaseEpochs(t *testing.T) {
	cs := fake.NewClientset()
	var mu sync.Mutex
	epochs := `[{"group":"tokenwarden","epoch":"1-aa"}]`
	l := &Lease{Client: cs, Namespace: "llm", ConfigMap: "fleet-proxy", Replica: "r1", Renew: time.Hour,
		Epochs: func() string { mu.Lock(); defer mu.Unlock(); return epochs }}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); l.Run(ctx) }()
	defer func() { cancel(); <-done }()
	waitFor := func(want string) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for {
			le, err := cs.CoordinationV1().Leases("llm").Get(context.Background(), "fleet-proxy-r1", metav1.GetOptions{})
			if err == nil && le.Annotations[DurableEpochsAnnotation] == want {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("want %s, lease %+v, error %v", want, le, err)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	l.Applied(1, "d1")
	waitFor(`[{"group":"tokenwarden","epoch":"1-aa"}]`)
	mu.Lock()
	epochs = `[{"group":"tokenwarden","epoch":"1-aa","fenced":true}]`
	mu.Unlock()
	l.Changed()
	waitFor(`[{"group":"tokenwarden","epoch":"1-aa","fenced":true}]`)
}

// TestLeaseHealth: the registry's upstreams' health rides on each renewal.
func TestLeaseHealth(t *testing.T) {
	cs := fake.NewClientset()
	var mu sync.Mutex
	health := `[{"upstream":"primary","breaker":"closed"}]`
	l := &Lease{Client: cs, Namespace: "llm", ConfigMap: "fleet-proxy", Replica: "r1", Renew: 20 * time.Millisecond,
		Health: func() string { mu.Lock(); defer mu.Unlock(); return health }}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); l.Run(ctx) }()
	defer func() { cancel(); <-done }()
	waitFor := func(want string) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for {
			le, err := cs.CoordinationV1().Leases("llm").Get(context.Background(), "fleet-proxy-r1", metav1.GetOptions{})
			if err == nil && le.Annotations[UpstreamHealthAnnotation] == want {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("want %s, lease %+v, error %v", want, le, err)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	l.Applied(1, "d1")
	waitFor(`[{"upstream":"primary","breaker":"closed"}]`)
	mu.Lock()
	health = `[{"upstream":"primary","breaker":"open"}]`
	mu.Unlock()
	waitFor(`[{"upstream":"primary","breaker":"open"}]`)
}

// TestLeaseLedger: the ledger's state rides on each renewal.
func TestLeaseLedger(t *testing.T) {
	cs := fake.NewClientset()
	var mu sync.Mutex
	state := `{"spool_batches":0,"spool_bytes":0}`
	l := &Lease{Client: cs, Namespace: "llm", ConfigMap: "fleet-proxy", Replica: "r1", Renew: 20 * time.Millisecond,
		Ledger: func() string { mu.Lock(); defer mu.Unlock(); return state }}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); l.Run(ctx) }()
	defer func() { cancel(); <-done }()
	waitFor := func(want string) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for {
			le, err := cs.CoordinationV1().Leases("llm").Get(context.Background(), "fleet-proxy-r1", metav1.GetOptions{})
			if err == nil && le.Annotations[LedgerAnnotation] == want {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("want %s, lease %+v, error %v", want, le, err)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	l.Applied(1, "d1")
	waitFor(`{"spool_batches":0,"spool_bytes":0}`)
	mu.Lock()
	state = `{"spooling":true,"spool_batches":3,"spool_bytes":4096}`
	mu.Unlock()
	waitFor(`{"spooling":true,"spool_batches":3,"spool_bytes":4096}`)
}
