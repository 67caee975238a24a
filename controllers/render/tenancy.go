// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package render

import (
	"strings"

	"sigs.k8s.io/controller-runtime/pkg/client"

	twv1alpha1 "github.com/tokenwarden/tokenwarden/api/v1alpha1"
)

// Tenancy. A fleet's namespace is the platform; under Namespaces each other accepted
// namespace is a tenant. A tenant's TokenBudgets render as rules of that tenant (they
// govern its keys only and replace only within it), whatever their shape; its keys
// carry their tenant, and their team and user are qualified by it, so that no tenant
// names another's. Under Flat every budget is the platform's, as before tenancy existed;
// the keys still carry their tenant, for the platform's PerTenant budgets.

// TenancyOf is the tenancy in force for a fleet: its spec's, else the one its status
// records, else Namespaces for a fleet never reconciled and Flat for one that an
// operator without tenancy reconciled (it has a status, and no tenancy in it).
func TenancyOf(tp *twv1alpha1.TokenProxy) twv1alpha1.Tenancy {
	switch {
	case tp.Spec.Tenancy != "":
		return tp.Spec.Tenancy
	case tp.Status.Tenancy != "":
		return tp.Status.Tenancy
	case tp.Status.ObservedGeneration > 0:
		return twv1alpha1.TenancyFlat
	}
	return twv1alpha1.TenancyNamespaces
}

// TenantOf is the tenant an object belongs to: its namespace when that is not its
// fleet's; "" for the platform's own objects.
func TenantOf(o client.Object) string {
	if Foreign(o) {
		return o.GetNamespace()
	}
	return ""
}

// Scoped reports whether an object of fleet tp is a tenant's, confined to its
// namespace: a Namespaces fleet, and an object of another namespace than the fleet's.
// A nil fleet (one that does not exist) scopes nothing.
func Scoped(tp *twv1alpha1.TokenProxy, o client.Object) bool {
	return tp != nil && Foreign(o) && TenancyOf(tp) == twv1alpha1.TenancyNamespaces
}

// RendersAsRules reports whether a budget of fleet tp renders into rules: a
// rules-shaped budget, or any budget of a tenant (the config's limits are the
// platform's).
func RendersAsRules(tp *twv1alpha1.TokenProxy, b *twv1alpha1.TokenBudget) bool {
	return RulesShaped(b) || Scoped(tp, b)
}

// Qualified is a team or user name of a tenant: tenant/name. Empty stays empty.
func Qualified(tenant, name string) string {
	if name == "" || tenant == "" {
		return name
	}
	return tenant + "/" + name
}

// qualifiedSubject is a tenant's subject of a team or user budget: already qualified
// by its own namespace, or qualified now. A subject qualified by another namespace is
// qualified again, so it names a team of this tenant and never another's.
func qualifiedSubject(tenant, s string) string {
	if strings.HasPrefix(s, tenant+"/") {
		return s
	}
	return Qualified(tenant, s)
}

// PlatformOnly reports whether a budget counts by tenant or selects on it, which only
// the platform may.
func PlatformOnly(b *twv1alpha1.TokenBudget) bool {
	return b.Spec.Dimension == twv1alpha1.DimensionPerTenant || b.Spec.CountBy == twv1alpha1.CountByTenant ||
		selects(b, twv1alpha1.CountByTenant)
}
