// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ReplicaUsageAnnotation on a replica's report Lease is the replica's usage report:
// its token buckets' use and its refusals (proxy/report.Usage, as JSON). The operator
// sums the fleet's reports into each TokenBudget's status.usage.
const ReplicaUsageAnnotation = "tokenwarden.io/usage"

// TokenBudgetUsage is the fleet's live use of one budget. The operator sums the live
// replicas' usage reports into it, and writes it at most once per refresh interval
// (15 s) per budget, and only when it changed meaningfully: a period's used
// percentage moved by 5 points or more, its use started or ended, the subjects at
// their limit or the top consumer changed, or a refusal count started, stopped,
// doubled or halved.
type TokenBudgetUsage struct {
	// ObservedAt is when the operator summed the reports written here.
	ObservedAt metav1.Time `json:"observedAt"`
	// Used is the largest part of an allowance in use, of either period (of any
	// window, for a budget in the rule shape), as a percentage ("37%"). For Global and PerModel (one bucket for the whole fleet) it
	// is the fleet's use of the budget; for PerClient, PerAPIKey, PerUser and PerTeam
	// (one bucket per subject) it is the top consumer's use of its own allowance. In
	// use means drawn and not yet refilled: at 100% the next request waits; above 100%
	// the bucket is in debt (an overage).
	// +optional
	// +kubebuilder:validation:MaxLength=16
	Used string `json:"used,omitempty"`
	// Minute and Day are each period's use, as for Used; absent when the period is
	// unlimited or not shown.
	// +optional
	Minute *PeriodUsage `json:"minute,omitempty"`
	// +optional
	Day *PeriodUsage `json:"day,omitempty"`
	// SubjectsAtLimit is, for a per-subject dimension, the number of subjects that
	// have used 95% or more of their allowance of either period (less than 5% left).
	// Under memory storage it is the largest count any one replica reports.
	// +optional
	SubjectsAtLimit *int32 `json:"subjectsAtLimit,omitempty"`
	// TopConsumer is, for a per-subject dimension, the subject that uses the largest
	// part of its allowance: the ApiKey (namespace/name for a key of another
	// namespace), the user, the team, or the client address (an IPv6 client's
	// prefix). Shown only on a budget in its fleet's own namespace: a budget of
	// another namespace governs other tenants' subjects too, and shows neither their
	// names nor their levels.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	TopConsumer string `json:"topConsumer,omitempty"`
	// Refusals counts the requests this budget refused over the last interval.
	Refusals BudgetRefusals `json:"refusals"`
	// Partial is true when a replica left this budget out of its report to keep the
	// report small (it then uses less than every budget it reported).
	// +optional
	Partial bool `json:"partial,omitempty"`
	// Windows are, for a budget in the rule shape (subjects, countBy, models, an
	// amount, windows), each window's use and refusals, in the order of
	// status.summary.windows. Used, SubjectsAtLimit and TopConsumer above are then
	// the most used window's, and the minute, day and refusal counts above stay
	// empty.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=16
	Windows []WindowUsage `json:"windows,omitempty"`
}

// WindowUsage is one window's use of a budget in the rule shape, in the window's
// amount: tokens, input or output tokens, requests, or US dollars. For a budget with
// one counter for the fleet (Global, or one named subject, without countBy) it is the
// fleet's use of that counter; for one with a counter per subject (or per countBy
// value) it is the top consumer's use of its own allowance, and the subjects at
// their limit. A rolling window's use is drawn and not yet refilled; a calendar
// window's is what was spent since the window started.
type WindowUsage struct {
	// Window is the window in words, as status.summary.windows writes it:
	// "600k/min", "50 req/s", "$1000/month".
	// +required
	// +kubebuilder:validation:MaxLength=128
	Window string `json:"window"`
	// UsedPercent is the part of the allowance in use, in percent (above 100 in debt);
	// absent, with Used, on a budget of another namespace with a counter per subject,
	// which shows no subject's level.
	// +optional
	UsedPercent *int32 `json:"usedPercent,omitempty"`
	// Used is the amount in use, in the window's units: "592k", "12 req", "$12.50".
	// +optional
	// +kubebuilder:validation:MaxLength=32
	Used string `json:"used,omitempty"`
	// SubjectsAtLimit is, for a budget with a counter per subject, the number of
	// counters that have used 95% or more of the window's allowance. Under memory
	// storage it is the largest count any one replica reports.
	// +optional
	SubjectsAtLimit *int32 `json:"subjectsAtLimit,omitempty"`
	// TopConsumer is, for a budget with a counter per subject, the subject (and
	// countBy value, after a comma) that uses the largest part of the window's
	// allowance; shown only on a budget in its fleet's own namespace.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	TopConsumer string `json:"topConsumer,omitempty"`
	// Refused counts the requests the window refused over the last interval
	// (status.usage.refusals.intervalSeconds), summed over the fleet; 0 when none.
	// +optional
	// +kubebuilder:validation:Minimum=0
	Refused int64 `json:"refused,omitempty"`
}

// PeriodUsage is one period's use of a budget.
type PeriodUsage struct {
	// UsedPercent is the part of the allowance in use, in percent (above 100 in debt).
	UsedPercent int32 `json:"usedPercent"`
	// UsedTokens is the tokens drawn and not yet refilled: of the fleet's one bucket,
	// or of the top consumer's.
	UsedTokens int64 `json:"usedTokens"`
}

// BudgetRefusals counts a budget's refusals over the replicas' last report interval,
// summed over the fleet: counts only, never a subject or its level.
type BudgetRefusals struct {
	// IntervalSeconds is the interval the counts cover.
	IntervalSeconds int64 `json:"intervalSeconds"`
	// Minute counts the refusals by the minute token budget.
	Minute int64 `json:"minute"`
	// Day counts the refusals by the day token budget.
	Day int64 `json:"day"`
	// Requests counts the refusals by the request rate (requestsPerSecond).
	Requests int64 `json:"requests"`
}
