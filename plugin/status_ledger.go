// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package plugin

import (
	"fmt"
	"slices"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	twv1alpha1 "github.com/tokenwarden/tokenwarden/api/v1alpha1"
	"github.com/tokenwarden/tokenwarden/proxy/ledger/ledgerstate"
)

// LedgerReach is what the fleet's live replicas report of their spend ledger: whether
// each writes to the ledger database or holds its settlements in its spool.
type LedgerReach struct {
	// Readable is false when the caller may not list the replicas' Leases; Note says so,
	// and the LedgerSpooling condition is then all there is.
	Readable bool   `json:"readable"`
	Note     string `json:"note,omitempty"`
	// Replicas are the live replicas that report a ledger, by name.
	Replicas []ReplicaLedger `json:"replicas,omitempty"`
}

// ReplicaLedger is one replica's ledger as its report Lease says
// (twv1alpha1.ReplicaLedgerAnnotation).
type ReplicaLedger struct {
	Name string `json:"name"`
	// Spooling: its last flush failed and batches wait in its spool; Full: the spool
	// has no room, and what does not fit is not recorded.
	Spooling     bool  `json:"spooling,omitempty"`
	Full         bool  `json:"full,omitempty"`
	SpoolBatches int   `json:"spoolBatches"`
	SpoolBytes   int64 `json:"spoolBytes"`
	// Oldest is when the oldest spooled batch was made; FlushedThrough, the last flush:
	// every settlement before it is in the database.
	Oldest         *time.Time `json:"oldest,omitempty"`
	FlushedThrough *time.Time `json:"flushedThrough,omitempty"`
	// DroppedBatches and ExpiredBatches were never recorded; UnrecordedRequests and
	// UnrecordedCostMicros are the requests they held and their micro-dollars.
	DroppedBatches       int64 `json:"droppedBatches,omitempty"`
	ExpiredBatches       int64 `json:"expiredBatches,omitempty"`
	UnrecordedRequests   int64 `json:"unrecordedRequests,omitempty"`
	UnrecordedCostMicros int64 `json:"unrecordedCostMicroUSD,omitempty"`
}

// hasLedger reports whether a fleet records to a ledger: its spec asks for one, or the
// operator says how its replicas' ledgers fare (the operator's default ledger).
func hasLedger(tp *twv1alpha1.TokenProxy) bool {
	if l := tp.Spec.Ledger; l != nil {
		return !l.Disabled
	}
	for _, c := range tp.Status.Conditions {
		if c.Type == twv1alpha1.ConditionLedgerSpooling {
			return true
		}
	}
	return false
}

// ledgerReach is the ledger reports of the live replicas among leases, or the note
// that they are not readable.
func ledgerReach(leases []coordinationv1.Lease, err error, now time.Time) *LedgerReach {
	if err != nil {
		return &LedgerReach{Note: err.Error()}
	}
	return &LedgerReach{Readable: true, Replicas: replicaLedgers(leases, now)}
}

// replicaLedgers reads the ledger reports of the live replicas among leases.
func replicaLedgers(leases []coordinationv1.Lease, now time.Time) []ReplicaLedger {
	var out []ReplicaLedger
	for i := range leases {
		le := &leases[i]
		v, ok := le.Annotations[twv1alpha1.ReplicaLedgerAnnotation]
		if !ok || !liveLease(le, now) {
			continue
		}
		l, ok := ledgerstate.Parse(v)
		if !ok {
			continue
		}
		r := ReplicaLedger{Spooling: l.Spooling, Full: l.Full, SpoolBatches: l.SpoolBatches, SpoolBytes: l.SpoolBytes,
			Oldest: utc(l.Oldest), FlushedThrough: utc(l.FlushedThrough), DroppedBatches: l.DroppedBatches, ExpiredBatches: l.ExpiredBatches,
			UnrecordedRequests: l.DroppedRequests + l.ExpiredRequests, UnrecordedCostMicros: l.DroppedCostMicros + l.ExpiredCostMicros}
		if le.Spec.HolderIdentity != nil {
			r.Name = *le.Spec.HolderIdentity
		}
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b ReplicaLedger) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// utc is t in UTC, nil for nil.
func utc(t *time.Time) *time.Time {
	if t == nil {
		return nil
	}
	u := t.UTC()
	return &u
}

// ledgerColumn is the LEDGER column: the live replicas whose settlements reach the
// database, of those that report a ledger.
func ledgerColumn(f FleetStatus) string {
	switch l := f.Ledger; {
	case l == nil:
		return "-"
	case !l.Readable:
		return "unknown"
	case len(l.Replicas) == 0:
		return "no reports"
	default:
		n := 0
		for _, r := range l.Replicas {
			if !r.Spooling && !r.Full {
				n++
			}
		}
		return fmt.Sprintf("%d/%d", n, len(l.Replicas))
	}
}

// lastFlush is the LAST FLUSH column: the oldest flushed-through time of the
// reporting replicas, through which every settlement of the fleet is recorded.
func lastFlush(f FleetStatus) string {
	if f.Ledger == nil || !f.Ledger.Readable {
		return "-"
	}
	var oldest *time.Time
	for _, r := range f.Ledger.Replicas {
		if t := r.FlushedThrough; t != nil && (oldest == nil || t.Before(*oldest)) {
			oldest = t
		}
	}
	if oldest == nil {
		return "-"
	}
	return oldest.Format(time.RFC3339)
}

// ledgerNotes are the status notes of a fleet's ledger: the reports that cannot be
// read, and each replica that spools, with how much waits and what was lost.
func ledgerNotes(l *LedgerReach) []string {
	if l == nil {
		return nil
	}
	if !l.Readable {
		return []string{fmt.Sprintf("Ledger: %s; the LedgerSpooling condition above is what the operator saw.", l.Note)}
	}
	var notes []string
	for _, r := range l.Replicas {
		if !r.Spooling && !r.Full && r.DroppedBatches+r.ExpiredBatches == 0 {
			continue
		}
		notes = append(notes, "Ledger: "+replicaLedgerNote(r)+".")
	}
	return notes
}

// replicaLedgerNote says what a replica's spool holds and what it lost.
func replicaLedgerNote(r ReplicaLedger) string {
	var parts []string
	if r.Spooling || r.Full {
		s := fmt.Sprintf("%s cannot write to the ledger database: %d batches (%s) wait in its spool",
			r.Name, r.SpoolBatches, resource.NewQuantity(r.SpoolBytes, resource.BinarySI))
		if r.Oldest != nil {
			s += ", the oldest from " + r.Oldest.Format(time.RFC3339)
		}
		if r.Full {
			s += ", and the spool is full"
		}
		parts = append(parts, s)
	} else {
		parts = append(parts, r.Name+" writes to the ledger database")
	}
	if r.FlushedThrough != nil {
		parts = append(parts, "recorded through "+r.FlushedThrough.Format(time.RFC3339))
	}
	if lost := r.DroppedBatches + r.ExpiredBatches; lost > 0 {
		parts = append(parts, fmt.Sprintf("%d batches never recorded (%d dropped with the spool full, %d expired): %d requests, $%.6f",
			lost, r.DroppedBatches, r.ExpiredBatches, r.UnrecordedRequests, float64(r.UnrecordedCostMicros)/1e6))
	}
	return strings.Join(parts, "; ")
}
