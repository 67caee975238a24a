// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package controllers

import (
	"fmt"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/api/meta"

	twv1alpha1 "github.com/tokenwarden/tokenwarden/api/v1alpha1"
)

// reportedCheck is one store check's last result as a replica reports it, with its
// durable epochs (budget.CheckResult).
type reportedCheck struct {
	Check  string `json:"check"`
	Result string `json:"result"`
	Detail string `json:"detail,omitempty"`
}

// checkFixes say what to do about each failed check (docs/runbooks.md).
var checkFixes = map[string]string{
	"maxmemory_policy":      "set maxmemory-policy noeviction on every master, so that a full Redis refuses writes instead of evicting counters",
	"destructive_commands":  "deny the fleet's Redis user FLUSHALL, FLUSHDB, RESTORE, DEBUG, DEL and UNLINK (the least-privilege user of docs/redis.md)",
	"cluster_full_coverage": "set cluster-require-full-coverage no on every master, so that the others keep serving their slots when one fails",
	"evictions":             "stop the evictions (maxmemory-policy noeviction, more memory), then restore or attest the balances with POST /admin/durable/attest",
}

// setStoreChecks sets StoreChecksFailed from the live replicas' store checks: True
// while one reports a failed check (FencedByCheck when one fences its calendar and
// cost budgets for it); removed while no replica reports checks.
func setStoreChecks(st *twv1alpha1.TokenProxyStatus, rs *reports, gen int64) {
	failed := map[string][]string{} // check: replicas
	details := map[string]string{}
	var fenced []string
	skipped, reported := map[string]bool{}, false
	for _, rr := range rs.live {
		for _, e := range rr.epochs {
			if e.StoreFence != "" && !slices.Contains(fenced, rr.name) {
				fenced = append(fenced, rr.name)
			}
			for _, c := range e.StoreChecks {
				reported = true
				switch c.Result {
				case "fail":
					if !slices.Contains(failed[c.Check], rr.name) {
						failed[c.Check] = append(failed[c.Check], rr.name)
					}
					if _, ok := details[c.Check]; !ok {
						details[c.Check] = c.Detail
					}
				case "skipped":
					skipped[c.Check] = true
				}
			}
		}
	}
	if !reported {
		meta.RemoveStatusCondition(&st.Conditions, twv1alpha1.ConditionStoreChecksFailed)
		return
	}
	if len(failed) == 0 && len(fenced) == 0 {
		msg := "Every live replica's checks of Redis pass"
		if len(skipped) > 0 {
			msg += fmt.Sprintf("; skipped for want of permission: %s (configure spec.storage.redis.storeChecks.username and passwordSecretRef)",
				strings.Join(sortedKeys(skipped), ", "))
		}
		setCondition(&st.Conditions, twv1alpha1.ConditionStoreChecksFailed, false, twv1alpha1.ReasonChecksPass, msg, gen)
		return
	}
	var parts []string
	for _, check := range sortedKeys(failed) {
		parts = append(parts, fmt.Sprintf("%s fails on replicas %s (%s): %s", check, strings.Join(failed[check], ", "), details[check], checkFixes[check]))
	}
	reason := twv1alpha1.ReasonCheckFailed
	msg := strings.Join(parts, ". ") + "."
	if len(fenced) > 0 {
		reason = twv1alpha1.ReasonFencedByCheck
		msg += fmt.Sprintf(" Replicas %s fence the calendar and cost budgets (503 budget_recovering) until the checks pass"+
			" (evictions: until the balances are attested); token budgets are unaffected.", strings.Join(fenced, ", "))
	} else {
		msg += " Report mode: nothing is fenced (spec.storage.redis.storeChecks.mode Enforce fences the calendar and cost budgets while a check fails)."
	}
	msg += " See docs/runbooks.md, \"A store check fails\"."
	setCondition(&st.Conditions, twv1alpha1.ConditionStoreChecksFailed, true, reason, truncate(msg, conditionMessageLimit), gen)
}

// sortedKeys are m's keys in order.
func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
