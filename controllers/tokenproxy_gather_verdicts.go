// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package controllers

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8slabels "k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	twv1alpha1 "github.com/tokenwarden/tokenwarden/api/v1alpha1"
	"github.com/tokenwarden/tokenwarden/controllers/render"
)

// Scoped reads (issue 13): the operator caches only the Secrets labelled for its use
// and the objects it owns, without their managed fields; a fleet accepts TokenBudgets
// and ApiKeys only from the namespaces it names, and bypass keys only where it allows
// them.

// The operator reads namespaces' labels for spec.allowedNamespaces.from: Selector.
// +kubebuilder:rbac:groups=core,resources=namespaces,verbs=get;list;watch

// managedByLabel is on every object the operator creates for a fleet (labels()).
const managedByLabel = "app.kubernetes.io/managed-by"

// proxyRefIndex is the index function of proxyRefField: "namespace/name" of the fleet.
func proxyRefIndex(o client.Object) []string { return []string{render.ProxyOf(o).String()} }

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

// weightVerdict refuses a tenant's key whose scheduling weight is above what its
// fleet allows tenants; ok is true when the key is accepted.
func weightVerdict(tp *twv1alpha1.TokenProxy, k *twv1alpha1.ApiKey) (verdict, bool) {
	if k.Namespace == tp.Namespace || k.Spec.Weight <= 1 {
		return verdict{}, true
	}
	limit, how := int32(1), "spec.maxTenantKeyWeight is unset, which under tenancy Namespaces allows tenants' keys weight 1"
	switch {
	case tp.Spec.MaxTenantKeyWeight != nil:
		limit, how = *tp.Spec.MaxTenantKeyWeight, fmt.Sprintf("spec.maxTenantKeyWeight: %d", *tp.Spec.MaxTenantKeyWeight)
	case render.TenancyOf(tp) == twv1alpha1.TenancyFlat:
		return verdict{}, true
	}
	if k.Spec.Weight <= limit {
		return verdict{}, true
	}
	return verdict{reason: twv1alpha1.ReasonWeightNotAllowed,
		message: fmt.Sprintf("The key sets weight %d, and TokenProxy %s/%s allows the keys of other namespaces at most %d (%s)",
			k.Spec.Weight, tp.Namespace, tp.Name, limit, how)}, false
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
		// Every fleet: a namespace's labels may select it, and name its keys' environment.
		out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&tps.Items[i])})
	}
	return out
}

// fleetVerdict refuses a rules-shaped budget that its fleet cannot enforce, saying
// what to change; ok when the fleet can.
func fleetVerdict(tp *twv1alpha1.TokenProxy, b *twv1alpha1.TokenBudget, divisor int64) (v verdict, ok bool) {
	if render.Scoped(tp, b) && render.PlatformOnly(b) {
		return verdict{reason: twv1alpha1.ReasonInvalidBudget, message: fmt.Sprintf(
			"A budget in tenant namespace %s counts only that tenant's keys, so it cannot count by tenant or select on it: "+
				"PerTenant, countBy Tenant and appliesWhen Tenant belong in the fleet's namespace %s", b.Namespace, tp.Namespace)}, false
	}
	if !render.RendersAsRules(tp, b) {
		return verdict{}, true
	}
	fleetName := fmt.Sprintf("TokenProxy %s", tp.Name)
	if render.Foreign(b) {
		fleetName = fmt.Sprintf("TokenProxy %s/%s", tp.Namespace, tp.Name)
	}
	if render.Durable(b) && tp.Spec.Storage.Type != twv1alpha1.StorageRedis {
		return verdict{reason: twv1alpha1.ReasonNeedsRedis, message: fmt.Sprintf(
			"A calendar window or a Cost amount must never reset to full because a proxy restarted, so it needs a fleet with Redis storage, and %s uses %s storage: "+
				"set the TokenProxy's spec.storage.type to Redis, or use rolling windows of tokens or requests", fleetName, storageOf(tp))}, false
	}
	if render.AmountOf(b) == twv1alpha1.AmountCost {
		if msg := unpriced(tp, b, fleetName); msg != "" {
			return verdict{reason: twv1alpha1.ReasonModelNotPriced, message: msg}, false
		}
	}
	// What else the proxy would refuse (a time zone it does not know, a name too long).
	c := render.Render(&render.Fleet{Proxy: tp, Budgets: []*twv1alpha1.TokenBudget{b}, Divisor: divisor})
	c.Default()
	if err := c.Validate(); err != nil {
		var lines []string
		for _, l := range strings.Split(err.Error(), "\n") {
			if strings.HasPrefix(l, "rate_limiting.rules[") {
				lines = append(lines, specField(l))
			}
		}
		if len(lines) > 0 {
			return verdict{reason: twv1alpha1.ReasonInvalidBudget,
				message: "The proxy would refuse this budget: " + strings.Join(lines, "; ")}, false
		}
	}
	return verdict{}, true
}

// unpriced says which models a Cost budget governs that its fleet gives no price,
// and what to do; "" when every one has a price.
func unpriced(tp *twv1alpha1.TokenProxy, b *twv1alpha1.TokenBudget, fleetName string) string {
	priced := map[string]bool{}
	for _, m := range tp.Spec.Models {
		priced[m.Name] = m.Price != nil
	}
	models := b.Spec.Models
	if len(models) == 0 && b.Spec.Dimension == twv1alpha1.DimensionPerModel {
		models = render.SubjectsOf(b)
	}
	if len(models) == 0 {
		if len(tp.Spec.Models) == 0 {
			return fmt.Sprintf("A Cost budget counts US dollars at its models' prices, and %s lists no models: "+
				"add the models this budget governs, with their prices, to the TokenProxy's spec.models, and name them in this budget's models", fleetName)
		}
		for _, m := range tp.Spec.Models {
			if m.Price == nil {
				models = append(models, m.Name)
			}
		}
		if len(models) == 0 {
			return ""
		}
		return fmt.Sprintf("A Cost budget without models governs every model of its fleet, and %s has no price for %s: "+
			"give it a price in the TokenProxy's spec.models, or name the priced models in this budget's models", fleetName, quoteList(models))
	}
	var missing []string
	for _, m := range models {
		if !priced[m] {
			missing = append(missing, m)
		}
	}
	if len(missing) == 0 {
		return ""
	}
	return fmt.Sprintf("A Cost budget counts US dollars at its models' prices, and %s has no price for %s: "+
		"add it with a price to the TokenProxy's spec.models, or remove it from this budget", fleetName, quoteList(missing))
}

func quoteList(names []string) string {
	q := make([]string, len(names))
	for i, n := range names {
		q[i] = strconv.Quote(n)
	}
	if len(q) == 1 {
		return "model " + q[0]
	}
	return "models " + strings.Join(q, ", ")
}

// specField names a config error's field as the TokenBudget spells it.
func specField(line string) string {
	i := strings.Index(line, "]")
	line = "spec" + line[i+1:]
	return strings.NewReplacer("burst_seconds", "burstSeconds", "time_zone", "timeZone", "day_of_month", "dayOfMonth",
		"count_by", "countBy").Replace(line)
}

// environmentOf is the environment of a namespace's keys, its label
// tokenwarden.io/environment ("" without one), read once per gather into seen.
func (r *TokenProxyReconciler) environmentOf(ctx context.Context, ns string, seen map[string]string) (string, error) {
	if env, ok := seen[ns]; ok {
		return env, nil
	}
	var n corev1.Namespace
	if err := r.Get(ctx, types.NamespacedName{Name: ns}, &n); err != nil && !apierrors.IsNotFound(err) {
		return "", fmt.Errorf("get Namespace %s: %w", ns, err)
	}
	seen[ns] = n.Labels[render.EnvironmentLabel]
	return seen[ns], nil
}
