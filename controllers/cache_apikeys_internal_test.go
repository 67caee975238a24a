// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package controllers

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	twv1alpha1 "github.com/tokenwarden/tokenwarden/api/v1alpha1"
)

// TestSlimAPIKey: the cache holds no copy of the object kubectl applied, nor managed
// fields, and keeps the key's other annotations and everything the operator reads.
func TestSlimAPIKey(t *testing.T) {
	k := &twv1alpha1.ApiKey{
		ObjectMeta: metav1.ObjectMeta{Name: "k", Namespace: "ns", Annotations: map[string]string{
			"kubectl.kubernetes.io/last-applied-configuration": `{"apiVersion":"tokenwarden.io/v1alpha1","kind":"ApiKey","spec":{"user":"alice"}}`,
			"team.example/owner": "alice",
		}, ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubectl"}}},
		Spec: twv1alpha1.ApiKeySpec{User: "alice", SecretRef: twv1alpha1.SecretKeyReference{Name: "s", Key: "key"}},
	}
	o, err := slimAPIKey(k)
	if err != nil {
		t.Fatal(err)
	}
	got := o.(*twv1alpha1.ApiKey)
	if _, there := got.Annotations["kubectl.kubernetes.io/last-applied-configuration"]; there {
		t.Errorf("the cache keeps kubectl's applied object: %v", got.Annotations)
	}
	if got.Annotations["team.example/owner"] != "alice" {
		t.Errorf("the key's own annotation is gone: %v", got.Annotations)
	}
	if got.ManagedFields != nil {
		t.Errorf("managed fields kept: %v", got.ManagedFields)
	}
	if got.Spec.User != "alice" || got.Spec.SecretRef != (twv1alpha1.SecretKeyReference{Name: "s", Key: "key"}) {
		t.Errorf("the spec changed: %+v", got.Spec)
	}

	only := &twv1alpha1.ApiKey{ObjectMeta: metav1.ObjectMeta{Name: "k", Namespace: "ns",
		Annotations: map[string]string{"kubectl.kubernetes.io/last-applied-configuration": "{}"}}}
	if o, _ := slimAPIKey(only); o.(*twv1alpha1.ApiKey).Annotations != nil {
		t.Errorf("an empty annotations map kept: %v", o.(*twv1alpha1.ApiKey).Annotations)
	}
}
