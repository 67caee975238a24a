// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package controllers

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/event"

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

// TestKeySecretIndex: an ApiKey is indexed by its namespace and Secret name.
func TestKeySecretIndex(t *testing.T) {
	k := &twv1alpha1.ApiKey{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "k"},
		Spec: twv1alpha1.ApiKeySpec{SecretRef: twv1alpha1.SecretKeyReference{Name: "s"}}}
	got, err := keySecretIndexers[keySecretIndex](k)
	if err != nil || len(got) != 1 || got[0] != "team/s" {
		t.Fatalf("indexed as %v (%v), want team/s", got, err)
	}
}
