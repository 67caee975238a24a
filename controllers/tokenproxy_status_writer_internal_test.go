// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package controllers

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	twv1alpha1 "github.com/tokenwarden/tokenwarden/api/v1alpha1"
)

// startAPIServer starts a real API server with the CRDs for the test, and returns a
// client of it and a context that ends with the test; it skips the test without
// KUBEBUILDER_ASSETS.
func startAPIServer(t *testing.T) (context.Context, client.WithWatch) {
	t.Helper()
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		t.Skip("KUBEBUILDER_ASSETS is not set")
	}
	env := &envtest.Environment{CRDDirectoryPaths: []string{filepath.Join("..", "config", "crd", "bases")}, ErrorIfCRDPathMissing: true}
	cfg, err := env.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	scheme := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme)
	_ = twv1alpha1.AddToScheme(scheme)
	real, err := client.NewWithWatch(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	return ctx, real
}

// TestStatusWriterOneFleet: one fleet's backlog of key statuses is written by every
// writer at once, against the real API server, and never by more: a burst of one
// fleet was written one status at a time, about 10 a second on a loaded machine.
func TestStatusWriterOneFleet(t *testing.T) {
	ctx, real := startAPIServer(t)

	const keys, writers = 200, 4
	fleet := types.NamespacedName{Namespace: "default", Name: "fleet"}
	var keysRead []*twv1alpha1.ApiKey
	for i := range keys {
		k := &twv1alpha1.ApiKey{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: fmt.Sprintf("key-%03d", i)},
			Spec: twv1alpha1.ApiKeySpec{ProxyRef: twv1alpha1.ProxyReference{Name: "fleet"}, SecretRef: twv1alpha1.SecretKeyReference{Name: "s"}}}
		if err := real.Create(ctx, k); err != nil {
			t.Fatal(err)
		}
		keysRead = append(keysRead, k)
	}

	// The writes in flight, counted around each status update the API server answers.
	var inFlight, most atomic.Int32
	var written sync.WaitGroup
	written.Add(keys)
	c := interceptor.NewClient(real, interceptor.Funcs{
		SubResourceUpdate: func(ctx context.Context, c client.Client, sub string, obj client.Object, opts ...client.SubResourceUpdateOption) error {
			n := inFlight.Add(1)
			for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
			}
			defer written.Done()
			defer inFlight.Add(-1)
			return c.SubResource(sub).Update(ctx, obj, opts...)
		},
	})
	w := newStatusWriter(c, 10000, writers)
	for _, k := range keysRead {
		st := &twv1alpha1.ApiKeyStatus{ObservedGeneration: k.Generation, Fingerprint: "0a1b2c3d"}
		w.enqueue(statusKey{kind: keyStatus, name: client.ObjectKeyFromObject(k)},
			&pendingStatus{fleet: fleet, status: st, resourceVersion: k.ResourceVersion, inputs: 1})
	}
	go func() { _ = w.Start(ctx) }()
	done := make(chan struct{})
	go func() { written.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(2 * time.Minute):
		t.Fatalf("the statuses were not written in 2 minutes")
	}
	if got := most.Load(); got != writers {
		t.Errorf("at most %d of one fleet's statuses were written at once, want %d (the writers)", got, writers)
	}
	var list twv1alpha1.ApiKeyList
	if err := real.List(ctx, &list, client.InNamespace("default")); err != nil {
		t.Fatal(err)
	}
	for _, k := range list.Items {
		if k.Status.Fingerprint != "0a1b2c3d" {
			t.Errorf("key %s has no status written", k.Name)
		}
	}
}

// TestStatusWriterFirstStatusFirst: a key waiting for its first status (just created)
// is written before a backlog of its fleet's other statuses, against the real API
// server. A key added after a scale waited behind every budget's new per-replica
// allowance, hundreds or thousands of writes, with no status at all meanwhile.
func TestStatusWriterFirstStatusFirst(t *testing.T) {
	ctx, real := startAPIServer(t)

	const backlog = 200
	fleet := types.NamespacedName{Namespace: "default", Name: "fleet"}
	newKey := func(name string) *twv1alpha1.ApiKey {
		k := &twv1alpha1.ApiKey{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
			Spec: twv1alpha1.ApiKeySpec{ProxyRef: twv1alpha1.ProxyReference{Name: "fleet"}, SecretRef: twv1alpha1.SecretKeyReference{Name: name}}}
		if err := real.Create(ctx, k); err != nil {
			t.Fatal(err)
		}
		return k
	}
	// The backlog: keys whose status already says their generation, each given a
	// later one (as the replicas' reports do).
	var settled []*twv1alpha1.ApiKey
	for i := range backlog {
		k := newKey(fmt.Sprintf("settled-%03d", i))
		k.Status = twv1alpha1.ApiKeyStatus{ObservedGeneration: k.Generation, Fingerprint: "00000000"}
		if err := real.Status().Update(ctx, k); err != nil {
			t.Fatal(err)
		}
		settled = append(settled, k)
	}
	created := newKey("created")

	var mu sync.Mutex
	var order []string
	c := interceptor.NewClient(real, interceptor.Funcs{
		SubResourceUpdate: func(ctx context.Context, c client.Client, sub string, obj client.Object, opts ...client.SubResourceUpdateOption) error {
			mu.Lock()
			order = append(order, obj.GetName())
			mu.Unlock()
			return c.SubResource(sub).Update(ctx, obj, opts...)
		},
	})
	w := newStatusWriter(c, 10000, 1)
	for _, k := range settled {
		st := &twv1alpha1.ApiKeyStatus{ObservedGeneration: k.Generation, Fingerprint: "0a1b2c3d"}
		w.enqueue(statusKey{kind: keyStatus, name: client.ObjectKeyFromObject(k)},
			&pendingStatus{fleet: fleet, status: st, resourceVersion: k.ResourceVersion, inputs: 1,
				first: firstStatus(k.Generation, k.Status.ObservedGeneration)})
	}
	st := &twv1alpha1.ApiKeyStatus{ObservedGeneration: created.Generation, Fingerprint: "0a1b2c3d"}
	w.enqueue(statusKey{kind: keyStatus, name: client.ObjectKeyFromObject(created)},
		&pendingStatus{fleet: fleet, status: st, resourceVersion: created.ResourceVersion, inputs: 1,
			first: firstStatus(created.Generation, created.Status.ObservedGeneration)})
	go func() { _ = w.Start(ctx) }()

	deadline := time.Now().Add(2 * time.Minute)
	for {
		mu.Lock()
		n := len(order)
		at := slices.Index(order, "created")
		mu.Unlock()
		if at >= 0 {
			if at != 0 {
				t.Errorf("the new key's first status was write %d of one writer, behind %d of its fleet's other statuses; want the first", at+1, at)
			}
			break
		}
		if n > backlog || time.Now().After(deadline) {
			t.Fatalf("the new key's status not written after %d writes", n)
		}
		time.Sleep(10 * time.Millisecond)
	}
	var k twv1alpha1.ApiKey
	if err := real.Get(ctx, client.ObjectKeyFromObject(created), &k); err != nil {
		t.Fatal(err)
	}
	if k.Status.Fingerprint != "0a1b2c3d" {
		t.Errorf("the new key's status is %+v, want the one queued", k.Status)
	}
}

// TestStatusWriterNoWriteOverItsOwn: a key status queued while an earlier one of the
// same key was being written, both computed from the version the first write
// replaces (a cache that has not caught up), is not written: it would conflict. The
// fleet's reconcile computes it again. A burst of 10,000 keys had 600 such conflicts.
func TestStatusWriterNoWriteOverItsOwn(t *testing.T) {
	ctx, real := startAPIServer(t)

	k := &twv1alpha1.ApiKey{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "key"},
		Spec: twv1alpha1.ApiKeySpec{ProxyRef: twv1alpha1.ProxyReference{Name: "fleet"}, SecretRef: twv1alpha1.SecretKeyReference{Name: "s"}}}
	if err := real.Create(ctx, k); err != nil {
		t.Fatal(err)
	}
	fleet := types.NamespacedName{Namespace: "default", Name: "fleet"}
	release := make(chan struct{})
	var mu sync.Mutex
	var results []error
	c := interceptor.NewClient(real, interceptor.Funcs{
		SubResourceUpdate: func(ctx context.Context, c client.Client, sub string, obj client.Object, opts ...client.SubResourceUpdateOption) error {
			<-release
			err := c.SubResource(sub).Update(ctx, obj, opts...)
			mu.Lock()
			results = append(results, err)
			mu.Unlock()
			return err
		},
	})
	w := newStatusWriter(c, 10000, 2)
	go func() { _ = w.Start(ctx) }()
	sk := statusKey{kind: keyStatus, name: client.ObjectKeyFromObject(k)}
	queue := func(fingerprint string) {
		w.enqueue(sk, &pendingStatus{fleet: fleet, status: &twv1alpha1.ApiKeyStatus{ObservedGeneration: 1, Fingerprint: fingerprint},
			resourceVersion: k.ResourceVersion, inputs: 1, first: true})
	}
	queue("00000001")
	for w.queued(fleet, sk, 1) && !w.writingNow(sk) {
		time.Sleep(time.Millisecond)
	}
	// The Ready status is being written; the reconcile that follows reads the key as
	// it was, and computes its next status from it.
	queue("00000002")
	close(release)

	select {
	case e := <-w.fleets:
		if e.Object != fleet {
			t.Errorf("reconcile queued for %v, want %v", e.Object, fleet)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the fleet's reconcile was not queued to compute the key's status again")
	}
	time.Sleep(time.Second) // a write of the second status would have been made by now
	mu.Lock()
	defer mu.Unlock()
	for i, err := range results {
		if err != nil {
			t.Errorf("write %d: %v", i+1, err)
		}
	}
	if len(results) != 1 {
		t.Errorf("%d status writes of the key, want 1 (the second was computed from the version the first replaced)", len(results))
	}
}

// writingNow says whether the status of k is being written.
func (w *statusWriter) writingNow(k statusKey) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.writing[k] != nil
}

// TestStatusWriterStale: a key read at the version its last status write replaced is
// stale until it is read at a later one, which forgets the write.
func TestStatusWriterStale(t *testing.T) {
	w := newStatusWriter(nil, 0, 0)
	k := types.NamespacedName{Namespace: "ns", Name: "key"}
	if w.stale(k, "7") {
		t.Error("a key never written is stale")
	}
	w.finish(context.Background(), statusKey{kind: keyStatus, name: k}, &pendingStatus{resourceVersion: "7"}, nil)
	if !w.stale(k, "7") {
		t.Error("the version the write replaced is not stale")
	}
	if w.stale(k, "8") {
		t.Error("a later version is stale")
	}
	if w.stale(k, "7") || len(w.wroteOver) != 0 {
		t.Errorf("a read at a later version did not forget the write: %v", w.wroteOver)
	}
}
