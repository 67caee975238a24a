// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package controllers

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"unsafe"

	corev1 "k8s.io/api/core/v1"
	toolscache "k8s.io/client-go/tools/cache"

	twv1alpha1 "github.com/tokenwarden/tokenwarden/api/v1alpha1"
)

// The operator needs of an ApiKey Secret only the SHA-256 of the key an ApiKey
// selects, so its cache holds no more (issue 14): at 50,000 keys the Secrets held
// whole, with their annotations, were a large part of the operator's heap, and the
// cache held every key. The transform replaces each data value of a Secret labelled
// for ApiKeys with the SHA-256 of the value without surrounding white space (empty
// for a value that is only white space), drops its annotations and managed fields,
// and marks it hashedSecretAnnotation. Credential Secrets stay whole: the pod
// template's annotation hashes their values (readCredentials).

// hashedSecretAnnotation marks a cached ApiKey Secret whose data values are the hex
// SHA-256 sums (64 digits) of the trimmed values, not the values: the form the
// document holds, read on every reconcile without encoding it. It exists only in the
// cache.
const hashedSecretAnnotation = "tokenwarden.io/cached-data"

// hashedSecretSHA256 is the value of hashedSecretAnnotation.
const hashedSecretSHA256 = "hex-sha256-of-trimmed-values"

// slimSecret is the cache transform of Secrets.
func slimSecret(o any) (any, error) {
	s, ok := o.(*corev1.Secret)
	if !ok {
		return o, nil
	}
	s.ManagedFields = nil
	if s.Labels[twv1alpha1.SecretUsageLabel] != twv1alpha1.SecretUsageAPIKey || s.Annotations[hashedSecretAnnotation] != "" {
		return s, nil
	}
	data := make(map[string][]byte, len(s.Data))
	for k, v := range s.Data {
		material := strings.TrimSpace(string(v))
		if material == "" {
			data[k] = []byte{}
			continue
		}
		sum := sha256.Sum256([]byte(material))
		data[k] = hex.AppendEncode(nil, sum[:])
	}
	s.Data = data
	s.StringData = nil
	s.Annotations = hashedSecretAnnotations
	if len(s.Labels) == 1 {
		s.Labels = apiKeySecretLabels
	}
	return s, nil
}

// hashedSecretAnnotations and apiKeySecretLabels are the annotations of every cached
// ApiKey Secret and the labels of those labelled with nothing else: one map each,
// shared by every such Secret of the cache, instead of two small maps a Secret (most
// of a cached Secret's memory). The cache's objects are never written to: a Get or a
// List copies them, and the reconciler reads them without a copy only to read.
var (
	hashedSecretAnnotations = map[string]string{hashedSecretAnnotation: hashedSecretSHA256}
	apiKeySecretLabels      = map[string]string{twv1alpha1.SecretUsageLabel: twv1alpha1.SecretUsageAPIKey}
)

var _ toolscache.TransformFunc = slimSecret

// keyHash returns the hex SHA-256 of a Secret's key without surrounding white space,
// from a Secret as the cache holds it (slimSecret) or as read whole; "" when the key
// is missing or empty.
func keyHash(s *corev1.Secret, key string) string {
	v := s.Data[key]
	if s.Annotations[hashedSecretAnnotation] == hashedSecretSHA256 {
		if len(v) == 0 {
			return ""
		}
		// The cache's bytes, which nothing writes to (slimSecret made them, a copy of
		// the Secret copies them): a 50,000-key fleet reads every hash on every
		// reconcile, without a copy.
		return unsafe.String(unsafe.SliceData(v), len(v))
	}
	material := strings.TrimSpace(string(v))
	if material == "" {
		return ""
	}
	sum := sha256.Sum256([]byte(material))
	return hex.EncodeToString(sum[:])
}
