// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package controllers

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8slabels "k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	twv1alpha1 "github.com/tokenwarden/tokenwarden/api/v1alpha1"
)

// Scoped reads (issue 13): the operator caches only the Secrets labelled for its use
// and the objects it owns, without their managed fields; a fleet accepts TokenBudgets
// and ApiKeys only from the namespaces it names, and bypass keys only where it allows
// them.

// The operator reads namespaces' labels for spec.allowedNamespaces.from: Selector.
// +kubebuilder:rbac:groups=core,resources=namespaces,verbs=get;list;watch

// managedByLabel is on every object the operator creates for a fleet (labels()).
const managedByLabel = "app.kubernetes.io/managed-by"

// proxyRefOf returns an object's reference to its fleet.
func proxyRefOf(o client.Object) twv1alpha1.ProxyReference {
	switch v := o.(type) {
	case *twv1alpha1.TokenBudget:
		return v.Spec.ProxyRef
	case *twv1alpha1.ApiKey:
		return v.Spec.ProxyRef
	}
	return twv1alpha1.ProxyReference{}
}

// proxyOf is the fleet an object references: in its own namespace unless the
// reference names another.
func proxyOf(o client.Object) types.NamespacedName {
	ref := proxyRefOf(o)
	ns := ref.Namespace
	if ns == "" {
		ns = o.GetNamespace()
	}
	return types.NamespacedName{Namespace: ns, Name: ref.Name}
}

// proxyRefIndex is the index function of proxyRefField: "namespace/name" of the fleet.
func proxyRefIndex(o client.Object) []string { return []string{proxyOf(o).String()} }

// foreign is true for an object outside its fleet's namespace.
func foreign(o client.Object) bool { return proxyOf(o).Namespace != o.GetNamespace() }

// displayName names an object in its fleet's messages: its name in the fleet's
// namespace, namespace/name in another.
func displayName(o client.Object) string {
	if foreign(o) {
		return o.GetNamespace() + "/" + o.GetName()
	}
	return o.GetName()
}

// renderedName is a key's name in the proxy config, unique in the fleet: its name in
// the fleet's namespace, namespace_name in another (neither a namespace nor an object
// name holds '_', and the config's names do not allow '/').
func renderedName(o client.Object) string {
	if foreign(o) {
		return o.GetNamespace() + "_" + o.GetName()
	}
	return o.GetName()
}

// objectKey keys an object in the verdict maps of one fleet.
func objectKey(o client.Object) string { return client.ObjectKeyFromObject(o).String() }

// namespaceVerdict refuses an object whose namespace the fleet does not accept
// objects from; ok is true when it is accepted.
func (r *TokenProxyReconciler) namespaceVerdict(ctx context.Context, tp *twv1alpha1.TokenProxy, o client.Object) (v verdict, ok bool, err error) {
	ns := o.GetNamespace()
	if ns == tp.Namespace {
		return verdict{}, true, nil
	}
	an := tp.Spec.AllowedNamespaces
	refuse := func(rule string) verdict {
		return verdict{reason: twv1alpha1.ReasonNotAllowed,
			message: fmt.Sprintf("TokenProxy %s/%s does not accept objects from namespace %s: its spec.allowedNamespaces %s", tp.Namespace, tp.Name, ns, rule)}
	}
	switch an.From {
	case twv1alpha1.NamespacesFromAll:
		return verdict{}, true, nil
	case twv1alpha1.NamespacesFromSelector:
		sel, err := metav1.LabelSelectorAsSelector(an.Selector)
		if err != nil {
			return refuse(fmt.Sprintf("has an invalid selector (%v)", err)), false, nil
		}
		var n corev1.Namespace
		if err := r.Get(ctx, types.NamespacedName{Name: ns}, &n); err != nil {
			if apierrors.IsNotFound(err) {
				return refuse(fmt.Sprintf("selects namespaces by labels %s, and namespace %s is gone", sel, ns)), false, nil
			}
			return verdict{}, false, fmt.Errorf("get Namespace %s: %w", ns, err)
		}
		if sel.Matches(k8slabels.Set(n.Labels)) {
			return verdict{}, true, nil
		}
		return refuse(fmt.Sprintf("selects namespaces by labels %s, which namespace %s does not carry", sel, ns)), false, nil
	default:
		return refuse("is from: Same, its own namespace only"), false, nil
	}
}

// bypassVerdict refuses a bypass key that its fleet does not allow; ok is true when
// the key is accepted.
func bypassVerdict(tp *twv1alpha1.TokenProxy, k *twv1alpha1.ApiKey) (verdict, bool) {
	if !k.Spec.Bypass {
		return verdict{}, true
	}
	switch tp.Spec.AllowBypass {
	case twv1alpha1.BypassAll:
		return verdict{}, true
	case twv1alpha1.BypassSame:
		if k.Namespace == tp.Namespace {
			return verdict{}, true
		}
		return verdict{reason: twv1alpha1.ReasonBypassNotAllowed,
			message: fmt.Sprintf("The key sets bypass, and TokenProxy %s/%s allows bypass only for keys in its own namespace (spec.allowBypass: Same)", tp.Namespace, tp.Name)}, false
	default:
		return verdict{reason: twv1alpha1.ReasonBypassNotAllowed,
			message: fmt.Sprintf("The key sets bypass, and TokenProxy %s/%s allows no bypass key (spec.allowBypass: None)", tp.Namespace, tp.Name)}, false
	}
}

// keySecretNotFound is the verdict of a key whose Secret the operator cannot read:
// one message whether the Secret is missing or not labelled for ApiKeys, so that an
// ApiKey does not tell whether an unlabelled Secret exists.
func keySecretNotFound(k *twv1alpha1.ApiKey) verdict {
	return verdict{reason: twv1alpha1.ReasonSecretNotFound, message: fmt.Sprintf("No Secret %s labelled %s=%s in namespace %s",
		k.Spec.SecretRef.Name, twv1alpha1.SecretUsageLabel, twv1alpha1.SecretUsageAPIKey, k.Namespace)}
}

// proxiesOfNamespace maps a namespace whose labels changed to the fleets that select
// namespaces by labels.
func (r *TokenProxyReconciler) proxiesOfNamespace(ctx context.Context, _ client.Object) []reconcile.Request {
	var tps twv1alpha1.TokenProxyList
	if err := r.List(ctx, &tps); err != nil {
		return nil
	}
	var out []reconcile.Request
	for i := range tps.Items {
		if tps.Items[i].Spec.AllowedNamespaces.From == twv1alpha1.NamespacesFromSelector {
			out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&tps.Items[i])})
		}
	}
	return out
}
