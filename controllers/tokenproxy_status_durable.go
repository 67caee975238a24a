// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package controllers

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	twv1alpha1 "github.com/tokenwarden/tokenwarden/api/v1alpha1"
	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/proxy/recovery/ready"
)

// The trust fence of durable counters, on the control plane. A proxy alone cannot
// tell a brand-new Redis from a flushed one, so the fleet remembers the epoch of its
// durable counters here: each replica reports the epoch it runs under in its Lease
// (ReplicaDurableEpochsAnnotation), the operator records the fleet's in
// status.durableEpochs and renders it into the config (rate_limiting.redis.epoch), and
// a replica whose Redis does not hold it fences its calendar and cost budgets until an
// administrator restores or attests their balances, which writes a newer epoch that
// the operator records in turn.

// reportedEpoch is one slot group's epoch as a replica reports it.
type reportedEpoch struct {
	Group  string `json:"group"`
	Epoch  string `json:"epoch,omitempty"`
	Fenced bool   `json:"fenced,omitempty"`
	Found  string `json:"found,omitempty"`
	// FencedAt is when the replica's fence began (Unix milliseconds, its clock).
	FencedAt int64 `json:"fenced_at,omitempty"`
	// StoreFence is what the store checks fence the durable rules for; StoreChecks
	// are the checks' last results (tokenproxy_status_storechecks.go).
	StoreFence  string          `json:"store_fence,omitempty"`
	StoreChecks []reportedCheck `json:"store_checks,omitempty"`
}

// parseEpochs reads a Lease's ReplicaDurableEpochsAnnotation; a value that does not
// parse reports nothing.
func parseEpochs(v string) []reportedEpoch {
	if v == "" {
		return nil
	}
	var out []reportedEpoch
	if err := json.Unmarshal([]byte(v), &out); err != nil {
		return nil
	}
	return out
}

// epochCreated is an epoch's creation time in Unix milliseconds; 0 when it has not
// an epoch's form.
func epochCreated(e string) int64 {
	ms, _, _ := strings.Cut(e, "-")
	n, err := strconv.ParseInt(ms, 10, 64)
	if err != nil {
		return 0
	}
	return n
}

// epochSkew bounds how far in the future (on the operator's clock) a reported epoch's
// creation may be: Redis' clock and the operator's agree to far better than this, and
// an epoch from further ahead (a forged report) would keep every later attestation
// from being recorded.
const epochSkew = 10 * time.Minute

// recordEpochs is the fleet's durable epochs: the recorded ones, each replaced by a
// newer one a live replica reports (an attestation's), and a group's first reported
// epoch for a group with none (a brand-new fleet). Only a replica that is not fenced
// vouches for an epoch: its Redis holds it. A forged report can only record an
// epoch Redis does not hold, which fences: it fails closed.
func recordEpochs(recorded []twv1alpha1.DurableEpoch, rs *reports, now time.Time) []twv1alpha1.DurableEpoch {
	out := append([]twv1alpha1.DurableEpoch(nil), recorded...)
	index := map[string]int{}
	for i, e := range out {
		index[e.Group] = i
	}
	for _, rr := range rs.live {
		for _, e := range rr.epochs {
			if e.Group == "" || e.Fenced || epochCreated(e.Epoch) == 0 || epochCreated(e.Epoch) > now.Add(epochSkew).UnixMilli() {
				continue
			}
			i, ok := index[e.Group]
			switch {
			case !ok:
				if len(out) >= 16 {
					continue
				}
				index[e.Group] = len(out)
				out = append(out, twv1alpha1.DurableEpoch{Group: e.Group, Epoch: e.Epoch})
			case epochCreated(e.Epoch) > epochCreated(out[i].Epoch),
				epochCreated(e.Epoch) == epochCreated(out[i].Epoch) && e.Epoch > out[i].Epoch:
				out[i].Epoch = e.Epoch
			}
		}
	}
	return out
}

// setFenced sets DurableBudgetsFenced from the live replicas' reports: True while one
// fences its durable budgets.
func setFenced(st *twv1alpha1.TokenProxyStatus, rs *reports, ledger string, gen int64) {
	var fenced []string
	var first *reportedEpoch
	for _, rr := range rs.live {
		for i, e := range rr.epochs {
			if e.Fenced {
				fenced = append(fenced, rr.name)
				if first == nil {
					first = &rr.epochs[i]
				}
				break
			}
		}
	}
	if first == nil {
		setCondition(&st.Conditions, twv1alpha1.ConditionDurableBudgetsFenced, false, twv1alpha1.ReasonTrusted,
			"Every live replica finds the epoch of its durable counters in Redis", gen)
		return
	}
	found := "no epoch"
	if first.Found != "" {
		found = "epoch " + first.Found
	}
	setCondition(&st.Conditions, twv1alpha1.ConditionDurableBudgetsFenced, true, twv1alpha1.ReasonCounterStateLost,
		fmt.Sprintf("Replicas %s: Redis holds %s, not the epoch %s the fleet's durable counters run under (group %q): "+
			"Redis restarted without its data or was flushed, so calendar and cost budgets answer 503 budget_recovering. "+
			"Restore their balances or attest what Redis holds with POST /admin/durable/attest on one replica "+
			"(the runbook: docs/runbooks.md); the fence lifts once the operator records the new epoch. "+
			"Do not flush or restart Redis to clear it.%s",
			strings.Join(fenced, ", "), found, first.Epoch, first.Group, ledger), gen)
}

// setLedgerAttestation sets, on each recorded group, the order to attest its lost
// counters from the spend ledger (ready.Order over the live replicas' reports), or
// clears it; a fleet without a ledger gets none. It returns, for the fenced
// condition's message, what the fleet's own attestation waits for or that it is
// ordered; "" when no group's counters are lost.
func setLedgerAttestation(st *twv1alpha1.TokenProxyStatus, rs *reports, hasLedger bool) string {
	note := ""
	for i := range st.DurableEpochs {
		e := &st.DurableEpochs[i]
		e.LedgerAttestation = nil
		if !hasLedger {
			continue
		}
		o, why := ready.Order(groupReports(rs, e.Group), ready.InFlightGrace)
		switch {
		case o != nil && o.Epoch == e.Epoch:
			e.LedgerAttestation = &twv1alpha1.LedgerAttestation{FlushedThrough: metav1.NewTime(time.UnixMilli(o.FlushedThroughMillis).UTC())}
			note = " Every live replica has flushed its spend ledger past the loss: one replica attests the balances from the ledger now."
		case why != ready.NoLoss:
			rs.ledgerWait = true
			note = " With a PostgreSQL spend ledger the fleet attests the balances from it once every live replica has flushed past the loss; not yet: " + why + "."
		}
	}
	return note
}

// groupReports are the live replicas' reports of one slot group, as ready.Order
// reads them.
func groupReports(rs *reports, group string) []ready.Replica {
	out := make([]ready.Replica, 0, len(rs.live))
	for _, rr := range rs.live {
		r := ready.Replica{Name: rr.name}
		for _, e := range rr.epochs {
			if e.Group == group {
				r.Epochs = append(r.Epochs, budget.GroupEpoch{Group: e.Group, Epoch: e.Epoch, Fenced: e.Fenced, Found: e.Found,
					FencedAt: e.FencedAt, StoreFence: e.StoreFence})
			}
		}
		if l := rr.ledger; l != nil {
			r.Ledger = true
			if l.FlushedThrough != nil {
				r.FlushedThrough = *l.FlushedThrough
			}
		}
		out = append(out, r)
	}
	return out
}

// eventLedgerAttestation records an Event when a group's attestation from the ledger
// is ordered, and when the epoch it ordered is replaced by a newer one (attested).
func (r *TokenProxyReconciler) eventLedgerAttestation(tp *twv1alpha1.TokenProxy, before, after []twv1alpha1.DurableEpoch) {
	if r.Events == nil {
		return
	}
	for _, b := range before {
		for _, a := range after {
			switch {
			case a.Group != b.Group:
			case a.LedgerAttestation != nil && b.LedgerAttestation == nil:
				r.Events.Eventf(tp, nil, corev1.EventTypeNormal, twv1alpha1.ReasonAttestingFromLedger, "Attest",
					"The durable counters of group %q, lost under epoch %s, are attested from the spend ledger: every live replica has flushed it through %s",
					a.Group, a.Epoch, a.LedgerAttestation.FlushedThrough.UTC().Format(time.RFC3339))
			case b.LedgerAttestation != nil && a.Epoch != b.Epoch:
				r.Events.Eventf(tp, nil, corev1.EventTypeNormal, twv1alpha1.ReasonAttestedFromLedger, "Attest",
					"The durable counters of group %q were attested from the spend ledger: the fleet runs under epoch %s", a.Group, a.Epoch)
			}
		}
	}
}
