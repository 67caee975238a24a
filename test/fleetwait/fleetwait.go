// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

// Package fleetwait tells when a fleet enforces what was applied to it, so that a test
// or the demo sends traffic only once every proxy holds the change it depends on.
//
// A change is enforced in two steps. The operator observes it and renders the fleet's
// config into the ConfigMap <fleet>-proxy, whose annotation
// tokenwarden.io/config-generation carries the config's generation G; it writes the
// ConfigMap before the statuses, so once the TokenProxy and every TokenBudget and
// ApiKey that references it show their current metadata.generation observed, the
// ConfigMap holds the change. Then each proxy applies the ConfigMap on its watch event
// and reports the generation it has applied at /admin/effective; once every proxy
// reports G or later, the fleet enforces the change.
//
// The operator now tells the same from the replicas' own reports (the Enforced
// condition, from a Lease each proxy renews). Wait still asks each proxy itself: it is
// the independent check the end-to-end suite holds that condition against, and the
// controller tests' in-process proxy writes no Lease.
//
// The package reads the API server through any client.Reader and each proxy through a
// Replica function, so that the stack's proxy processes and the controller tests'
// in-process proxy are waited for the same way. It imports neither the operator nor
// the proxy.
package fleetwait

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	twv1alpha1 "github.com/tokenwarden/tokenwarden/api/v1alpha1"
)

// Interval is how often Wait reads the API server and the proxies.
const Interval = 50 * time.Millisecond

// Replica is one proxy of a fleet as Wait sees it.
type Replica struct {
	// Name identifies the proxy in errors, for example
	// "proxy 1 (admin http://127.0.0.1:41234)".
	Name string
	// Generation returns the generation of the config the proxy has applied
	// (/admin/effective's "generation").
	Generation func(context.Context) (int64, error)
}

// Observed returns nil once the operator has observed the current state of the fleet:
// the TokenProxy's status.observedGeneration is its metadata.generation, every
// TokenBudget and ApiKey whose spec.proxyRef is the fleet (in its namespace, or in
// another that names the fleet's) has
// its current generation observed and Ready=True for it, and the fleet's status counts
// as many budgets and keys in force as reference it (so a create or a delete has been
// rendered too). Otherwise the error names the first object that is not observed, or
// not Ready and why.
//
// Ready=True is required, not only an observed generation: an ApiKey may be observed
// first with SecretNotFound and become Ready when its Secret's event arrives. An
// object that is meant to be refused (a Conflicted budget, a key without its Secret)
// therefore keeps Observed from returning nil. A changed Secret does not change an
// ApiKey's generation; Observed cannot see it.
func Observed(ctx context.Context, c client.Reader, namespace, name string) error {
	var tp twv1alpha1.TokenProxy
	if err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, &tp); err != nil {
		return fmt.Errorf("get TokenProxy %s/%s: %w", namespace, name, err)
	}
	if tp.Status.ObservedGeneration != tp.Generation {
		return fmt.Errorf("the operator has not observed TokenProxy %s/%s: generation %d, status.observedGeneration %d",
			namespace, name, tp.Generation, tp.Status.ObservedGeneration)
	}

	// Objects of other namespaces count only for a fleet that accepts them: a list of
	// every namespace's keys is long on a cluster that holds a large fleet.
	var where []client.ListOption
	if from := tp.Spec.AllowedNamespaces.From; from == "" || from == twv1alpha1.NamespacesFromSame {
		where = append(where, client.InNamespace(namespace))
	}
	var budgets twv1alpha1.TokenBudgetList
	if err := c.List(ctx, &budgets, where...); err != nil {
		return fmt.Errorf("list TokenBudgets: %w", err)
	}
	nBudgets := 0
	for i := range budgets.Items {
		b := &budgets.Items[i]
		if !refersTo(b, b.Spec.ProxyRef, namespace, name) || !b.DeletionTimestamp.IsZero() {
			continue
		}
		nBudgets++
		if err := observedReady("TokenBudget", b, b.Status.ObservedGeneration, b.Status.Conditions); err != nil {
			return err
		}
	}

	var keys twv1alpha1.ApiKeyList
	if err := c.List(ctx, &keys, where...); err != nil {
		return fmt.Errorf("list ApiKeys: %w", err)
	}
	nKeys := 0
	for i := range keys.Items {
		k := &keys.Items[i]
		if !refersTo(k, k.Spec.ProxyRef, namespace, name) || !k.DeletionTimestamp.IsZero() {
			continue
		}
		nKeys++
		if err := observedReady("ApiKey", k, k.Status.ObservedGeneration, k.Status.Conditions); err != nil {
			return err
		}
	}

	// The fleet's status is written last in a reconcile: its counts tell whether the
	// objects that were created or deleted since have been rendered.
	if int(tp.Status.Budgets) != nBudgets || int(tp.Status.Keys) != nKeys {
		return fmt.Errorf("the operator has not rendered the latest TokenBudgets and ApiKeys of TokenProxy %s/%s: "+
			"its status counts %d budgets and %d keys in force, %d and %d reference it",
			namespace, name, tp.Status.Budgets, tp.Status.Keys, nBudgets, nKeys)
	}
	return nil
}

// refersTo reports whether an object's proxyRef names the fleet namespace/name.
func refersTo(o client.Object, ref twv1alpha1.ProxyReference, namespace, name string) bool {
	ns := ref.Namespace
	if ns == "" {
		ns = o.GetNamespace()
	}
	return ref.Name == name && ns == namespace
}

func observedReady(kind string, o client.Object, observed int64, conds []metav1.Condition) error {
	ref := kind + " " + o.GetNamespace() + "/" + o.GetName()
	if observed != o.GetGeneration() {
		return fmt.Errorf("the operator has not observed %s: generation %d, status.observedGeneration %d", ref, o.GetGeneration(), observed)
	}
	ready := meta.FindStatusCondition(conds, twv1alpha1.ConditionReady)
	switch {
	case ready == nil:
		return fmt.Errorf("%s has no Ready condition yet", ref)
	case ready.ObservedGeneration != o.GetGeneration():
		return fmt.Errorf("the Ready condition of %s is for generation %d, not %d", ref, ready.ObservedGeneration, o.GetGeneration())
	case ready.Status != metav1.ConditionTrue:
		return fmt.Errorf("%s is not Ready: %s: %s", ref, ready.Reason, ready.Message)
	}
	return nil
}

// ConfigGeneration returns the generation of the config in the fleet's ConfigMap
// (<fleet>-proxy, annotation tokenwarden.io/config-generation).
func ConfigGeneration(ctx context.Context, c client.Reader, namespace, name string) (int64, error) {
	var cm corev1.ConfigMap
	if err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name + "-proxy"}, &cm); err != nil {
		return 0, fmt.Errorf("get ConfigMap %s/%s-proxy: %w", namespace, name, err)
	}
	v, ok := cm.Annotations[twv1alpha1.ConfigGenerationAnnotation]
	if !ok {
		return 0, fmt.Errorf("ConfigMap %s/%s-proxy has no annotation %s", namespace, name, twv1alpha1.ConfigGenerationAnnotation)
	}
	g, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("ConfigMap %s/%s-proxy: annotation %s=%q: %w", namespace, name, twv1alpha1.ConfigGenerationAnnotation, v, err)
	}
	return g, nil
}

// Target returns the generation the fleet must reach to enforce its current state:
// the ConfigMap's, once Observed returns nil.
func Target(ctx context.Context, c client.Reader, namespace, name string) (int64, error) {
	if err := Observed(ctx, c, namespace, name); err != nil {
		return 0, err
	}
	return ConfigGeneration(ctx, c, namespace, name)
}

// Lagging returns nil when every replica has applied generation g or a later one;
// otherwise an error that names the first replica that has not, and the generation
// it has.
func Lagging(ctx context.Context, replicas []Replica, g int64) error {
	for _, r := range replicas {
		got, err := r.Generation(ctx)
		if err != nil {
			return fmt.Errorf("%s: %w", r.Name, err)
		}
		if got < g {
			return fmt.Errorf("%s has applied generation %d, the fleet's config is generation %d", r.Name, got, g)
		}
	}
	return nil
}

// Wait waits until the operator has observed the fleet (Observed) and every replica
// has applied the generation of its ConfigMap or a later one, and returns that
// generation. On timeout or cancellation the error names what lagged: the object the
// operator had not observed, or the proxy with the generation it had.
func Wait(ctx context.Context, c client.Reader, namespace, name string, replicas []Replica, timeout time.Duration) (int64, error) {
	var (
		g    int64
		last error
	)
	err := wait.PollUntilContextTimeout(ctx, Interval, timeout, true, func(ctx context.Context) (bool, error) {
		// A read cut short by the deadline says less than the one before it.
		fail := func(err error) (bool, error) {
			if last == nil || ctx.Err() == nil {
				last = err
			}
			return false, nil
		}
		var err error
		if g, err = Target(ctx, c, namespace, name); err != nil {
			return fail(err)
		}
		if err := Lagging(ctx, replicas, g); err != nil {
			return fail(err)
		}
		return true, nil
	})
	if err == nil {
		return g, nil
	}
	if last == nil {
		last = err
	}
	if errors.Is(ctx.Err(), context.Canceled) {
		return 0, fmt.Errorf("fleet %s/%s: %w (last: %w)", namespace, name, ctx.Err(), last)
	}
	return 0, fmt.Errorf("fleet %s/%s does not enforce its current config after %v: %w", namespace, name, timeout, last)
}
