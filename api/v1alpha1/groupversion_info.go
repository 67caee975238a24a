// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

// Package v1alpha1 contains the tokenwarden.io/v1alpha1 API: TokenProxy (a fleet of
// budget-enforcing proxies), TokenBudget (a token budget on one dimension) and ApiKey
// (a client credential).
// +kubebuilder:object:generate=true
// +groupName=tokenwarden.io
package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupVersion is the group and version used to register these objects.
var GroupVersion = schema.GroupVersion{Group: "tokenwarden.io", Version: "v1alpha1"}

// AddToScheme adds the types of this group-version to a scheme. The types are listed
// here rather than registered from init functions.
func AddToScheme(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion,
		&TokenProxy{}, &TokenProxyList{},
		&TokenBudget{}, &TokenBudgetList{},
		&ApiKey{}, &ApiKeyList{},
	)
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}
