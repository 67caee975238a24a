// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package render

import (
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	twv1alpha1 "github.com/tokenwarden/tokenwarden/api/v1alpha1"
)

// ProxyRefOf returns an object's reference to its fleet.
func ProxyRefOf(o client.Object) twv1alpha1.ProxyReference {
	switch v := o.(type) {
	case *twv1alpha1.TokenBudget:
		return v.Spec.ProxyRef
	case *twv1alpha1.ApiKey:
		return v.Spec.ProxyRef
	}
	return twv1alpha1.ProxyReference{}
}

// ProxyOf is the fleet an object references: in its own namespace unless the
// reference names another.
func ProxyOf(o client.Object) types.NamespacedName {
	ref := ProxyRefOf(o)
	ns := ref.Namespace
	if ns == "" {
		ns = o.GetNamespace()
	}
	return types.NamespacedName{Namespace: ns, Name: ref.Name}
}

// Foreign is true for an object outside its fleet's namespace.
func Foreign(o client.Object) bool { return ProxyOf(o).Namespace != o.GetNamespace() }

// DisplayName names an object in its fleet's messages: its name in the fleet's
// namespace, namespace/name in another.
func DisplayName(o client.Object) string {
	if Foreign(o) {
		return o.GetNamespace() + "/" + o.GetName()
	}
	return o.GetName()
}

// RenderedName is a key's name in the proxy config, unique in the fleet: its name in
// the fleet's namespace, namespace_name in another (neither a namespace nor an object
// name holds '_', and the config's names do not allow '/').
func RenderedName(o client.Object) string {
	if Foreign(o) {
		return o.GetNamespace() + "_" + o.GetName()
	}
	return o.GetName()
}

// ObjectKey keys an object in the verdict maps of one fleet.
func ObjectKey(o client.Object) string { return client.ObjectKeyFromObject(o).String() }
