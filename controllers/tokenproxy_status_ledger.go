// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package controllers

import (
	"fmt"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"

	twv1alpha1 "github.com/tokenwarden/tokenwarden/api/v1alpha1"
	"github.com/tokenwarden/tokenwarden/proxy/ledger/ledgerstate"
)

// parseLedger reads a Lease's ReplicaLedgerAnnotation; nil when absent or when it
// does not parse.
func parseLedger(v string) *ledgerstate.State {
	l, ok := ledgerstate.Parse(v)
	if !ok {
		return nil
	}
	return &l
}

// ledgerKey is what of a ledger report changes the condition: a reconcile for a
// change of it, not for each flush's new flushed_through.
func ledgerKey(v string) string {
	l := parseLedger(v)
	if l == nil {
		return ""
	}
	return fmt.Sprintf("%t/%t/%d/%d", l.Spooling, l.Full, l.DroppedRows, l.ExpiredRows)
}

// unrecordedNote says what the live replicas' ledgers never recorded, replica by
// replica, in requests and dollars; empty when nothing is missing.
func unrecordedNote(rs *reports) string {
	var parts []string
	for _, rr := range rs.live {
		if l := rr.ledger; l != nil && l.Unrecorded() {
			parts = append(parts, fmt.Sprintf("%s: %d requests, $%.6f (%d batches dropped with the spool full, %d expired)",
				rr.name, l.DroppedRequests+l.ExpiredRequests, float64(l.DroppedCostMicros+l.ExpiredCostMicros)/1e6,
				l.DroppedBatches, l.ExpiredBatches))
		}
	}
	if len(parts) == 0 {
		return ""
	}
	return "The ledger never recorded what these replicas served: " + strings.Join(parts, "; ") +
		" (tokenwarden_ledger_unrecorded_cost_micro_usd_total); the budgets' counters still charged it."
}

// setLedgerSpooling sets LedgerSpooling from the live replicas' reports: True while
// one spools (SpoolFull when one's spool is full); removed from a fleet without a
// ledger whose replicas report none.
func setLedgerSpooling(st *twv1alpha1.TokenProxyStatus, rs *reports, hasLedger bool, gen int64) {
	var spooling, full []string
	var batches int
	var bytes int64
	var oldest time.Time
	reported := false
	for _, rr := range rs.live {
		l := rr.ledger
		if l == nil {
			continue
		}
		reported = true
		if !l.Spooling && !l.Full {
			continue
		}
		spooling = append(spooling, rr.name)
		if l.Full {
			full = append(full, rr.name)
		}
		batches += l.SpoolBatches
		bytes += l.SpoolBytes
		if l.Oldest != nil && (oldest.IsZero() || l.Oldest.Before(oldest)) {
			oldest = *l.Oldest
		}
	}
	if !hasLedger && !reported {
		meta.RemoveStatusCondition(&st.Conditions, twv1alpha1.ConditionLedgerSpooling)
		return
	}
	lost := unrecordedNote(rs)
	if len(spooling) == 0 {
		msg := "Every live replica's settlements reach the ledger database"
		if lost != "" {
			msg += ". " + lost
		}
		setCondition(&st.Conditions, twv1alpha1.ConditionLedgerSpooling, false, twv1alpha1.ReasonFlushed, truncate(msg, conditionMessageLimit), gen)
		return
	}
	since := ""
	if !oldest.IsZero() {
		since = ", the oldest from " + oldest.UTC().Format(time.RFC3339)
	}
	msg := fmt.Sprintf("Replicas %s cannot write to the ledger database: %d batches (%d bytes) wait in their spools%s, "+
		"and are replayed once it answers. Look at the database and at the proxies' logs (Ledger flush failed).",
		strings.Join(spooling, ", "), batches, bytes, since)
	reason := twv1alpha1.ReasonSpooling
	if len(full) > 0 {
		reason = twv1alpha1.ReasonSpoolFull
		msg += fmt.Sprintf(" The spools of %s are full: what does not fit is not recorded (counted in "+
			"tokenwarden_ledger_unrecorded_requests_total), and with whenSpoolFull: Refuse the requests cost budgets govern are refused.",
			strings.Join(full, ", "))
	}
	setCondition(&st.Conditions, twv1alpha1.ConditionLedgerSpooling, true, reason, truncate(strings.TrimSpace(msg+" "+lost), conditionMessageLimit), gen)
}

// setLedgerFallback sets LedgerFallback on a fleet that asks for the ledger fallback
// (removes it otherwise): off, and why, when the fleet has no ledger to answer from.
func setLedgerFallback(st *twv1alpha1.TokenProxyStatus, tp *twv1alpha1.TokenProxy, hasLedger bool) {
	r := tp.Spec.Storage.Redis
	if storageOf(tp) != twv1alpha1.StorageRedis || r == nil || r.LedgerFallback == nil {
		meta.RemoveStatusCondition(&st.Conditions, twv1alpha1.ConditionLedgerFallback)
		return
	}
	if hasLedger {
		setCondition(&st.Conditions, twv1alpha1.ConditionLedgerFallback, true, twv1alpha1.ReasonLedgerFallbackOn,
			"spec.storage.redis.ledgerFallback: while Redis is unreachable, the cost budgets counted by API key, user, team "+
				"or tenant answer from the fleet's PostgreSQL spend ledger", tp.Generation)
		return
	}
	setCondition(&st.Conditions, twv1alpha1.ConditionLedgerFallback, false, twv1alpha1.ReasonNoLedger,
		"spec.storage.redis.ledgerFallback is off: it needs the fleet's PostgreSQL spend ledger (spec.ledger.urlSecretRef, "+
			"or the operator's default ledger, and spec.ledger.disabled unset), and the fleet has none; every calendar "+
			"and cost budget fails closed while Redis is unreachable", tp.Generation)
}
