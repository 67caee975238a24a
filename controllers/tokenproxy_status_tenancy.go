// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package controllers

import (
	"fmt"

	twv1alpha1 "github.com/tokenwarden/tokenwarden/api/v1alpha1"
	"github.com/tokenwarden/tokenwarden/controllers/render"
)

// setTenancy records the tenancy in force in the fleet's status, so that a fleet whose
// spec leaves it unset keeps the meaning it was first given, and names it in the
// TenantIsolation condition.
func setTenancy(st *twv1alpha1.TokenProxyStatus, tp *twv1alpha1.TokenProxy) {
	t := render.TenancyOf(tp)
	st.Tenancy = t
	how := "spec.tenancy"
	if tp.Spec.Tenancy == "" {
		how = "spec.tenancy is unset and the fleet was created with tenancy"
		if t == twv1alpha1.TenancyFlat {
			how = "spec.tenancy is unset and the fleet was created before tenancy existed"
		}
	}
	if t == twv1alpha1.TenancyNamespaces {
		setCondition(&st.Conditions, twv1alpha1.ConditionTenantIsolation, true, twv1alpha1.ReasonTenancyNamespaces, fmt.Sprintf(
			"Tenancy Namespaces (%s): the TokenBudgets of each accepted namespace other than %s apply only to its own keys, "+
				"and its keys' teams and users are qualified by it", how, tp.Namespace), tp.Generation)
		return
	}
	setCondition(&st.Conditions, twv1alpha1.ConditionTenantIsolation, false, twv1alpha1.ReasonTenancyFlat, fmt.Sprintf(
		"Tenancy Flat (%s): every accepted TokenBudget applies to the whole fleet, and teams and users are shared by name "+
			"across namespaces; set spec.tenancy: Namespaces to confine each namespace's budgets to its own keys", how), tp.Generation)
}
