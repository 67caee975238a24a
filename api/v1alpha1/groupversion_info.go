// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

// Package v1alpha1 contains the tokenwarden.io/v1alpha1 API: TokenProxy (a fleet of
// budget-enforcing proxies), TokenBudget (a token budget on one dimension) and ApiKey
// (a client credential).
// +kubebuilder:object:generate=true
// +groupName=tokenwarden.io
package v1alpha1

import (
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/scheme"
)

var (
	// GroupVersion is the group and version used to register these objects.
	GroupVersion = schema.GroupVersion{Group: "tokenwarden.io", Version: "v1alpha1"}

	// SchemeBuilder adds the Go types to a runtime.Scheme.
	SchemeBuilder = &scheme.Builder{GroupVersion: GroupVersion}

	// AddToScheme adds the types in this group-version to the given scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)
