// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package controllers

import (
	"unique"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	toolscache "k8s.io/client-go/tools/cache"

	twv1alpha1 "github.com/tokenwarden/tokenwarden/api/v1alpha1"
)

// A fleet's ApiKeys are most of the operator's cache at scale (issue 14), and most of
// an ApiKey's strings repeat across the fleet: its namespace, its fleet's name, its
// team, and the type, status, reason and message of its three conditions, which the
// operator writes alike for every key of one state. The decoder allocates each of
// them anew for every key; the cache transform replaces each with one shared copy
// (unique.Make: a copy lives while some object holds it), about 250 bytes a key.

// slimAPIKey is the cache transform of ApiKeys: no managed fields and no copy of the
// last object kubectl applied (an annotation as large as the key, which the operator
// never reads), repeated strings shared.
func slimAPIKey(o any) (any, error) {
	k, ok := o.(*twv1alpha1.ApiKey)
	if !ok {
		return o, nil
	}
	k.ManagedFields = nil
	if _, there := k.Annotations[lastAppliedAnnotation]; there {
		delete(k.Annotations, lastAppliedAnnotation)
		if len(k.Annotations) == 0 {
			k.Annotations = nil
		}
	}
	k.APIVersion, k.Kind = intern(k.APIVersion), intern(k.Kind)
	k.Namespace = intern(k.Namespace)
	k.Spec.SecretRef.Key = intern(k.Spec.SecretRef.Key)
	k.Spec.ProxyRef.Name = intern(k.Spec.ProxyRef.Name)
	k.Spec.ProxyRef.Namespace = intern(k.Spec.ProxyRef.Namespace)
	k.Spec.Team = intern(k.Spec.Team)
	shareConditionStrings(k.Status.Conditions)
	return k, nil
}

// shareConditionStrings replaces the type, status, reason and message of each
// condition with its shared copy.
func shareConditionStrings(conds []metav1.Condition) {
	for i := range conds {
		c := &conds[i]
		c.Type = intern(c.Type)
		c.Status = intern(c.Status)
		c.Reason = intern(c.Reason)
		c.Message = intern(c.Message)
	}
}

var _ toolscache.TransformFunc = slimAPIKey

// lastAppliedAnnotation is where kubectl apply keeps the object it applied.
const lastAppliedAnnotation = "kubectl.kubernetes.io/last-applied-configuration"

// intern returns the shared copy of s.
func intern[S ~string](s S) S {
	if s == "" {
		return s
	}
	return unique.Make(s).Value()
}
