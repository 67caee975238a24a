// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package controllers

import (
	"fmt"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	twv1alpha1 "github.com/tokenwarden/tokenwarden/api/v1alpha1"
)

// TestSecretChanged: an update of a Secret that changes neither its data nor its
// labels reconciles no fleet; one that changes either does.
func TestSecretChanged(t *testing.T) {
	base := func() *corev1.Secret {
		return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "s", ResourceVersion: "1",
			Labels: map[string]string{twv1alpha1.SecretUsageLabel: twv1alpha1.SecretUsageAPIKey}},
			Data: map[string][]byte{"key": []byte("h1")}}
	}
	p := secretChanged()
	for what, change := range map[string]func(s *corev1.Secret){
		"its data":   func(s *corev1.Secret) { s.Data["key"] = []byte("h2") },
		"a data key": func(s *corev1.Secret) { s.Data["other"] = []byte("h3") },
		"its labels": func(s *corev1.Secret) { s.Labels = nil },
	} {
		n := base()
		change(n)
		if !p.Update(event.UpdateEvent{ObjectOld: base(), ObjectNew: n}) {
			t.Errorf("a change of %s reconciles nothing", what)
		}
	}
	n := base()
	n.ResourceVersion = "2"
	n.Annotations = map[string]string{"note": "x"}
	if p.Update(event.UpdateEvent{ObjectOld: base(), ObjectNew: n}) {
		t.Error("an update that changes neither data nor labels reconciles the fleets")
	}
}

// TestKeySecretIndex: a Secret maps to the fleets of the keys that reference it, and
// no other key's, and the index holds a set for each bucket of Secret names, not one
// for each key (each key's Secret is its own).
func TestKeySecretIndex(t *testing.T) {
	keys := toolscache.NewIndexer(toolscache.MetaNamespaceKeyFunc, keySecretIndexers)
	r := &TokenProxyReconciler{indexes: indexers{keys: keys, keySecrets: true}}
	key := func(name, secret, fleet string) *twv1alpha1.ApiKey {
		return &twv1alpha1.ApiKey{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: name},
			Spec: twv1alpha1.ApiKeySpec{SecretRef: twv1alpha1.SecretKeyReference{Name: secret}, ProxyRef: twv1alpha1.ProxyReference{Name: fleet}}}
	}
	const n = 5000
	for i := range n {
		if err := keys.Add(key(fmt.Sprintf("k-%d", i), fmt.Sprintf("s-%d", i), fmt.Sprintf("fleet-%d", i%2))); err != nil {
			t.Fatal(err)
		}
	}
	// Another Secret of s-1's bucket, used by a key of a third fleet.
	other := ""
	for i := n; other == ""; i++ {
		if s := fmt.Sprintf("s-%d", i); keySecretBucket("team", s) == keySecretBucket("team", "s-1") {
			other = s
		}
	}
	if err := keys.Add(key("k-other", other, "fleet-x")); err != nil {
		t.Fatal(err)
	}
	got, ok := r.fleetsOfKeySecret("team", "s-1")
	if want := []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: "team", Name: "fleet-1"}}}; !ok || !slices.Equal(got, want) {
		t.Errorf("the Secret s-1 maps to %v (%t), want %v", got, ok, want)
	}
	if got, _ := r.fleetsOfKeySecret("other-namespace", "s-1"); len(got) != 0 {
		t.Errorf("a Secret of another namespace maps to %v", got)
	}
	if sets := len(keys.ListIndexFuncValues(keySecretIndex)); sets > keySecretBuckets {
		t.Errorf("the index holds %d sets for %d keys, want at most %d", sets, n+1, keySecretBuckets)
	}
}
