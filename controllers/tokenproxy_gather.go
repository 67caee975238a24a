// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package controllers

import (
	"cmp"
	"context"
	"fmt"
	"slices"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	twv1alpha1 "github.com/tokenwarden/tokenwarden/api/v1alpha1"
	"github.com/tokenwarden/tokenwarden/controllers/render"
)

// gathered is what one fleet is rendered from, and the verdict on every object read.
type gathered struct {
	render.Fleet
	// allBudgets and allKeys are every object that references the fleet, accepted or
	// not: the ones whose status this reconcile writes.
	allBudgets     []*twv1alpha1.TokenBudget
	allKeys        []keyRead
	budgetVerdicts map[string]verdict // by TokenBudget render.ObjectKey
	// credentials are what the pods read from Secrets.
	credentials credentials
	// deployment is the fleet's Deployment as read, nil when there is none.
	deployment *appsv1.Deployment
}

// keyRead is an ApiKey as read, with its verdict and its Secret's fingerprint.
type keyRead struct {
	key         *twv1alpha1.ApiKey
	verdict     verdict
	fingerprint string
}

// verdict is an object's Accepted condition.
type verdict struct {
	accepted bool
	reason   string
	message  string
}

// gather reads what the fleet is made of, from the cache: its TokenBudgets and
// ApiKeys (every one that references it), their Secrets, its Deployment and the
// credentials its pods read. It gives each budget and key its verdict (refused for
// its namespace, as a bypass key the fleet does not allow, as a budget the fleet
// cannot enforce, as the loser of a conflict with an older one, or for a missing
// Secret or key) and keeps the accepted ones to render. An error is a read that
// failed: nothing is rendered then.
func (r *TokenProxyReconciler) gather(ctx context.Context, tp *twv1alpha1.TokenProxy) (*gathered, error) {
	g := &gathered{
		Fleet:          render.Fleet{Proxy: tp},
		budgetVerdicts: map[string]verdict{},
	}
	// The budgets, keys and Secrets are read from the cache without copies: a fleet of
	// 50,000 keys would copy them all on every reconcile. Nothing here writes to them;
	// the status writers copy the one they write.
	var budgets twv1alpha1.TokenBudgetList
	if err := r.List(ctx, &budgets, client.MatchingFields{proxyRefField: client.ObjectKeyFromObject(tp).String()},
		client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("list TokenBudgets: %w", err)
	}
	allowed := make([]*twv1alpha1.TokenBudget, 0, len(budgets.Items))
	for _, b := range byObjectKey(budgets.Items) {
		if !b.DeletionTimestamp.IsZero() {
			continue
		}
		g.allBudgets = append(g.allBudgets, b)
		v, ok, err := r.namespaceVerdict(ctx, tp, b)
		if err != nil {
			return nil, err
		}
		if !ok {
			g.budgetVerdicts[render.ObjectKey(b)] = v
			continue
		}
		allowed = append(allowed, b)
	}
	if err := r.readDeployment(ctx, tp, g); err != nil {
		return nil, err
	}
	// A budget the fleet cannot enforce is not in force, so it conflicts with none.
	enforceable := allowed[:0:0]
	for _, b := range allowed {
		if v, ok := fleetVerdict(tp, b, g.Divisor); !ok {
			g.budgetVerdicts[render.ObjectKey(b)] = v
			continue
		}
		enforceable = append(enforceable, b)
	}
	winners, losers, conflicted := render.ResolveConflicts(tp, enforceable)
	g.Budgets = winners
	for _, b := range winners {
		g.budgetVerdicts[render.ObjectKey(b)] = verdict{accepted: true, reason: twv1alpha1.ReasonAccepted, message: "The budget is in force"}
	}
	for _, b := range losers {
		g.budgetVerdicts[render.ObjectKey(b)] = verdict{reason: twv1alpha1.ReasonConflicted, message: conflicted[render.ObjectKey(b)]}
	}

	keys, err := r.fleetKeys(ctx, tp)
	if err != nil {
		return nil, err
	}
	inForce := verdict{accepted: true, reason: twv1alpha1.ReasonAccepted, message: "The key is in force"}
	secrets := map[string]map[string]*corev1.Secret{} // read through the client: by namespace and name
	envs := map[string]string{}                       // each namespace's environment label
	g.allKeys = make([]keyRead, 0, len(keys))
	g.Keys = make([]render.KeyInput, 0, len(keys))
	for _, k := range keys {
		if !k.DeletionTimestamp.IsZero() {
			continue
		}
		g.allKeys = append(g.allKeys, keyRead{key: k})
		read := &g.allKeys[len(g.allKeys)-1]
		v, ok, err := r.namespaceVerdict(ctx, tp, k)
		if err != nil {
			return nil, err
		}
		if ok {
			v, ok = bypassVerdict(tp, k)
		}
		if ok {
			v, ok = weightVerdict(tp, k)
		}
		if !ok {
			read.verdict = v
			continue
		}
		// The cache holds only the Secrets labelled for the operator's use; an ApiKey
		// may use only those labelled for ApiKeys, in its own namespace.
		s, err := r.apiKeySecret(ctx, k.Namespace, k.Spec.SecretRef.Name, secrets)
		if err != nil {
			return nil, err
		}
		if s == nil {
			read.verdict = keySecretNotFound(k)
			continue
		}
		hash := keyHash(s, secretKey(k.Spec.SecretRef))
		if hash == "" {
			read.verdict = verdict{reason: twv1alpha1.ReasonSecretKeyMissing,
				message: fmt.Sprintf("Secret %s has no key %q, or it is empty", k.Spec.SecretRef.Name, secretKey(k.Spec.SecretRef))}
			continue
		}
		env, err := r.environmentOf(ctx, k.Namespace, envs)
		if err != nil {
			return nil, err
		}
		g.Keys = append(g.Keys, render.KeyInput{Key: k, Hash: hash, Read: len(g.allKeys) - 1, Environment: env})
		read.fingerprint = hash[:8]
		read.verdict = inForce
	}
	var lostKeys []render.KeyInput
	g.Keys, lostKeys = render.ResolveKeyConflicts(g.Keys)
	for _, l := range lostKeys {
		g.allKeys[l.Read].verdict = verdict{reason: twv1alpha1.ReasonConflicted, message: l.Conflict}
	}

	creds, err := r.readCredentials(ctx, tp)
	if err != nil {
		return nil, err
	}
	g.credentials = creds

	return g, nil
}

// readDeployment reads the fleet's Deployment, if any, and the budget division it
// implies.
func (r *TokenProxyReconciler) readDeployment(ctx context.Context, tp *twv1alpha1.TokenProxy, g *gathered) error {
	var deploy appsv1.Deployment
	err := r.Get(ctx, types.NamespacedName{Namespace: tp.Namespace, Name: proxyName(tp)}, &deploy)
	switch {
	case apierrors.IsNotFound(err):
		g.Divisor = divisor(tp, nil)
	case err != nil:
		return fmt.Errorf("get Deployment: %w", err)
	default:
		g.Divisor = divisor(tp, &deploy)
		g.deployment = &deploy
	}
	return nil
}

// apiKeySecrets are the Secrets of a namespace labelled for ApiKeys, by name, as the
// cache holds them: not to be written to.
func (r *TokenProxyReconciler) apiKeySecrets(ctx context.Context, namespace string) (map[string]*corev1.Secret, error) {
	var list corev1.SecretList
	if err := r.List(ctx, &list, client.InNamespace(namespace),
		client.MatchingLabels{twv1alpha1.SecretUsageLabel: twv1alpha1.SecretUsageAPIKey}, client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("list the ApiKey Secrets of %s: %w", namespace, err)
	}
	out := make(map[string]*corev1.Secret, len(list.Items))
	for i := range list.Items {
		out[list.Items[i].Name] = &list.Items[i]
	}
	return out, nil
}

// byObjectKey returns pointers to the items, in the order of their render.ObjectKey
// (namespace/name), without making the keys: a fleet of 50,000 keys sorts on every
// reconcile.
func byObjectKey[T any, P interface {
	*T
	client.Object
}](items []T) []P {
	out := make([]P, len(items))
	for i := range items {
		out[i] = P(&items[i])
	}
	slices.SortFunc(out, func(a, b P) int {
		return compareJoined(a.GetNamespace(), a.GetName(), b.GetNamespace(), b.GetName())
	})
	return out
}

// compareJoined compares a1+"/"+a2 with b1+"/"+b2, as strings.Compare would, without
// joining them.
func compareJoined(a1, a2, b1, b2 string) int {
	at := func(s1, s2 string, i int) byte {
		switch {
		case i < len(s1):
			return s1[i]
		case i == len(s1):
			return '/'
		default:
			return s2[i-len(s1)-1]
		}
	}
	la, lb := len(a1)+1+len(a2), len(b1)+1+len(b2)
	for i := range min(la, lb) {
		if ca, cb := at(a1, a2, i), at(b1, b2, i); ca != cb {
			if ca < cb {
				return -1
			}
			return 1
		}
	}
	return cmp.Compare(la, lb)
}

func secretKey(ref twv1alpha1.SecretKeyReference) string {
	if ref.Key == "" {
		return "key"
	}
	return ref.Key
}

// divisor is the budget division: max(desired, current) replicas, so a rolling
// update's surge pods or a scale-down in progress never raise the fleet above its
// total. The desired count is the TokenProxy's, which the Deployment is set to.
func divisor(tp *twv1alpha1.TokenProxy, d *appsv1.Deployment) int64 {
	n := int64(1)
	if tp.Spec.Replicas != nil {
		n = int64(*tp.Spec.Replicas)
	}
	if d != nil {
		if d.Spec.Replicas != nil {
			n = max(n, int64(*d.Spec.Replicas))
		}
		n = max(n, int64(d.Status.Replicas))
	}
	return max(n, 1)
}
