// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package admin

import (
	"context"
	"slices"

	"github.com/tokenwarden/tokenwarden/proxy/accesslog"
	"github.com/tokenwarden/tokenwarden/proxy/adminauth"
	"github.com/tokenwarden/tokenwarden/proxy/budget"
)

// TenantPaths are the admin paths that return per-tenant data: a caller that may not
// read them as a whole is served the tenants it may read (adminauth.GuardTenants).
var TenantPaths = []string{"/admin/effective", "/admin/refusals", "/admin/explain"}

// scopeRefusals keeps the refusals whose tenant the caller may read: the tenant each
// was recorded with (the anonymous callers' and the platform's keys' are the
// platform's), so a key the config moved to another tenant since shows the new
// tenant none of the old one's refusals. A key left with none is left out.
func scopeRefusals(ctx context.Context, out []accesslog.KeyRefusals) []accesslog.KeyRefusals {
	sc := adminauth.ScopeOf(ctx)
	if sc.All() {
		return out
	}
	for i := range out {
		out[i].Refusals = slices.DeleteFunc(out[i].Refusals, func(r accesslog.AuditedRefusal) bool { return !sc.Tenant(ctx, r.Tenant) })
	}
	return slices.DeleteFunc(out, func(k accesslog.KeyRefusals) bool { return len(k.Refusals) == 0 })
}

// scopeEffective keeps what the caller may read of the config in force: the keys,
// key limits and rules of its tenants; the platform's (its limits and rules, the
// upstreams, models and warnings) only for a reader of the fleet's namespace.
func scopeEffective(ctx context.Context, e Effective) Effective {
	sc := adminauth.ScopeOf(ctx)
	if sc.All() {
		return e
	}
	tenantOf := make(map[string]string, len(e.APIKeys))
	for _, k := range e.APIKeys {
		tenantOf[k.Name] = k.Tenant
	}
	e.APIKeys = slices.DeleteFunc(e.APIKeys, func(k EffectiveKey) bool { return !sc.Tenant(ctx, k.Tenant) })
	e.Rules = slices.DeleteFunc(e.Rules, func(r budget.EffectiveRule) bool { return !sc.Tenant(ctx, r.Tenant) })
	platform := sc.Tenant(ctx, "")
	// A dimension's limits are the platform's; a key's override is its tenant's.
	e.Limits = slices.DeleteFunc(e.Limits, func(l budget.Effective) bool {
		if l.Key != "" {
			return !sc.Tenant(ctx, tenantOf[l.Key])
		}
		return !platform
	})
	if !platform {
		e.Upstreams, e.Models, e.Warnings, e.RestartRequired = []EffectiveUpstrm{}, []EffectiveModel{}, []string{}, []string{}
	}
	return e
}
