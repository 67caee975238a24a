// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package v1alpha1

import "k8s.io/apimachinery/pkg/api/resource"

// LedgerSpec records every settlement of the fleet, tokens and dollars in per-minute
// rollups, in a PostgreSQL database the replicas share, for audit and chargeback
// reports (docs/ledger.md). While the database is unreachable each pod keeps what it
// could not write in a bounded spool on an emptyDir and replays it.
type LedgerSpec struct {
	// Disabled turns the record off, also when the operator has a default ledger
	// (the chart's proxyLedger). Default false.
	// +optional
	Disabled bool `json:"disabled,omitempty"`
	// URLSecretRef selects the database's URL,
	// postgres://USER:PASSWORD@HOST:5432/DATABASE?sslmode=require, in a Secret
	// labelled tokenwarden.io/secret=credential (the URL holds the password).
	// Default: the operator's default ledger Secret, if it has one.
	// +optional
	URLSecretRef *SecretKeyReference `json:"urlSecretRef,omitempty"`
	// SpoolSize bounds what each pod keeps while the database is unreachable; its
	// emptyDir is sized at twice this. Default 64Mi.
	// +optional
	// +kubebuilder:validation:XValidation:rule="!quantity(string(self)).isLessThan(quantity('1Mi'))",message="spoolSize must be at least 1Mi"
	// +kubebuilder:validation:XValidation:rule="!quantity(string(self)).isGreaterThan(quantity('8Gi'))",message="spoolSize must be at most 8Gi"
	SpoolSize *resource.Quantity `json:"spoolSize,omitempty"`
	// FlushIntervalSeconds is how often each pod writes its rollups: with spoolSize it
	// bounds what a pod lost with its disk takes with it. Default 10.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=300
	FlushIntervalSeconds int64 `json:"flushIntervalSeconds,omitempty"`
	// WhenSpoolFull is what a pod does while its spool is full and the database
	// unreachable: KeepServing (serve, and count what could not be recorded; the
	// budgets are still enforced) or Refuse (refuse the requests that cost budgets
	// govern). Default KeepServing.
	// +optional
	// +kubebuilder:validation:Enum=KeepServing;Refuse
	WhenSpoolFull LedgerFullPolicy `json:"whenSpoolFull,omitempty"`
}

// LedgerFullPolicy is what a proxy does while its ledger spool is full.
type LedgerFullPolicy string

// Ledger spool policies.
const (
	LedgerKeepServing LedgerFullPolicy = "KeepServing"
	LedgerRefuse      LedgerFullPolicy = "Refuse"
)

// ConditionLedgerSpooling is, on a TokenProxy with a ledger, True while a live
// replica reports that settlements wait in its spool because the ledger database
// does not take them; its message says how much waits and since when, and whether a
// spool is full (what does not fit is counted, not recorded). Reasons: Spooling,
// SpoolFull, Flushed.
const ConditionLedgerSpooling = "LedgerSpooling"

// Reasons of LedgerSpooling.
const (
	ReasonSpooling  = "Spooling"
	ReasonSpoolFull = "SpoolFull"
	ReasonFlushed   = "Flushed"
)

// ConditionLedgerFallback is, on a TokenProxy that sets
// spec.storage.redis.ledgerFallback, whether the fallback is in force: True
// (LedgerFallbackOn) with a PostgreSQL ledger, False (NoLedger) without one (no
// spec.ledger.urlSecretRef and no default ledger of the operator, or
// spec.ledger.disabled), when every calendar and cost budget fails closed while Redis
// is unreachable. Absent when the field is unset.
const ConditionLedgerFallback = "LedgerFallback"

// Reasons of LedgerFallback.
const (
	ReasonLedgerFallbackOn = "LedgerFallbackOn"
	ReasonNoLedger         = "NoLedger"
)

// ReplicaLedgerAnnotation on a replica's Lease is its ledger's state, as JSON
// (ledgerstate.State): {"spooling", "full", "spool_batches", "spool_bytes", "oldest",
// "flushed_through"} (oldest and flushed_through in RFC 3339), and what it never
// recorded, "dropped_" and "expired_" batches, rows, requests and cost_micro_usd;
// absent without a ledger.
const ReplicaLedgerAnnotation = "tokenwarden.io/ledger"
