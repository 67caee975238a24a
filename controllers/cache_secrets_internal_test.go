// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package controllers

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	twv1alpha1 "github.com/tokenwarden/tokenwarden/api/v1alpha1"
)

// TestSlimSecret: the cache holds no key of an ApiKey Secret, only the hash the
// operator renders, per data key; credential Secrets stay whole.
func TestSlimSecret(t *testing.T) {
	const value = "sk-the-key-itself"
	secret := func(usage string) *corev1.Secret {
		return &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: "s", Namespace: "ns",
				Labels:        map[string]string{twv1alpha1.SecretUsageLabel: usage},
				Annotations:   map[string]string{"kubectl.kubernetes.io/last-applied-configuration": `{"stringData":{"key":"` + value + `"}}`},
				ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubectl"}}},
			Data: map[string][]byte{"key": []byte(" " + value + "\n"), "other": []byte("second-key"), "blank": []byte(" \n")},
		}
	}
	want := func(v string) string { s := sha256.Sum256([]byte(v)); return hex.EncodeToString(s[:]) }

	o, err := slimSecret(secret(twv1alpha1.SecretUsageAPIKey))
	if err != nil {
		t.Fatal(err)
	}
	s := o.(*corev1.Secret)
	for k, v := range s.Data {
		if bytes.Contains(v, []byte(value)) || bytes.Contains(v, []byte("second-key")) {
			t.Errorf("cached data %q holds the key", k)
		}
	}
	for _, a := range s.Annotations {
		if bytes.Contains([]byte(a), []byte(value)) {
			t.Errorf("cached annotations hold the key: %v", s.Annotations)
		}
	}
	if s.ManagedFields != nil {
		t.Errorf("managed fields kept: %v", s.ManagedFields)
	}
	if got := keyHash(s, "key"); got != want(value) {
		t.Errorf("keyHash(key) = %q, want %q (the trimmed value's)", got, want(value))
	}
	if got := keyHash(s, "other"); got != want("second-key") {
		t.Errorf("keyHash(other) = %q, want %q", got, want("second-key"))
	}
	if got := keyHash(s, "blank"); got != "" {
		t.Errorf("keyHash(blank) = %q, want empty", got)
	}
	if got := keyHash(s, "missing"); got != "" {
		t.Errorf("keyHash(missing) = %q, want empty", got)
	}
	// Transforming twice (a relist) changes nothing.
	again, _ := slimSecret(s)
	if got := keyHash(again.(*corev1.Secret), "key"); got != want(value) {
		t.Errorf("after a second transform keyHash(key) = %q, want %q", got, want(value))
	}
	// A Secret read whole (not from the cache) hashes the same.
	if got := keyHash(secret(twv1alpha1.SecretUsageAPIKey), "key"); got != want(value) {
		t.Errorf("keyHash of a whole Secret = %q, want %q", got, want(value))
	}

	c, _ := slimSecret(secret(twv1alpha1.SecretUsageCredential))
	if got := string(c.(*corev1.Secret).Data["key"]); got != " "+value+"\n" {
		t.Errorf("credential Secret's data = %q, want it whole", got)
	}
}
