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

// ConditionProjectedToRunOut is, on a TokenBudget with a calendar window, True when,
// at the burn rate of the last hour, the window's spend reaches its limit before the
// window resets (status.forecast); False when it does not; Unknown while the operator
// has watched the window for less than five minutes. The operator records an event of
// the same reason each time it turns True.
const ConditionProjectedToRunOut = "ProjectedToRunOut"

// Reasons of ProjectedToRunOut.
const (
	ReasonProjectedToRunOut = "ProjectedToRunOut"
	ReasonWithinLimit       = "WithinLimit"
	ReasonCollectingSamples = "CollectingSamples"
)

// BudgetForecast is the spend of a budget's first calendar window and where it heads:
// the spend so far, and at the burn rate of the last hour (or since the oldest sample,
// when the operator has watched for less), the spend at the window's reset and when
// it runs out. The burn rate is the net increase of the spend over the lookback
// divided by the lookback: the formula of the TokenwardenCalendarBudgetRunningOut
// alert. For a budget with a counter per subject the figures are the most spent
// counter's.
type BudgetForecast struct {
	// Window is the window in words, as status.summary.windows writes it: "$1000/month".
	// +kubebuilder:validation:MaxLength=128
	Window string `json:"window"`
	// Spent is what was spent since the window started, in its units: "$500.00".
	// +kubebuilder:validation:MaxLength=32
	Spent string `json:"spent"`
	// SpentPercent is Spent's part of the limit, in percent.
	SpentPercent int32 `json:"spentPercent"`
	// ResetsAt is when the window ends and the next one starts at zero.
	ResetsAt metav1.Time `json:"resetsAt"`
	// LookbackSeconds is the time the burn rate is measured over: an hour once the
	// operator has watched that long; absent, with the projection, under five minutes.
	// +optional
	LookbackSeconds int64 `json:"lookbackSeconds,omitempty"`
	// BurnRate is the spend per hour over the lookback: "$3.60/h".
	// +optional
	// +kubebuilder:validation:MaxLength=32
	BurnRate string `json:"burnRate,omitempty"`
	// Projected is the spend at the window's reset at the burn rate, with its part of
	// the limit: "$1358.00 (136%)".
	// +optional
	// +kubebuilder:validation:MaxLength=48
	Projected string `json:"projected,omitempty"`
	// ProjectedPercent is the projected spend's part of the limit, in percent.
	// +optional
	ProjectedPercent *int32 `json:"projectedPercent,omitempty"`
	// RunsOutAt is when the spend reaches the limit at the burn rate; absent when
	// nothing is spent over the lookback. Before ResetsAt, ProjectedToRunOut is True.
	// +optional
	RunsOutAt *metav1.Time `json:"runsOutAt,omitempty"`
	// Samples are the spend the operator observed, one every five minutes or more,
	// back to the newest one an hour old: what the burn rate is measured from.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=16
	Samples []SpendSample `json:"samples,omitempty"`
}

// SpendSample is a window's spend observed at one time.
type SpendSample struct {
	// At is when the spend was observed.
	At metav1.Time `json:"at"`
	// WindowStart is when the window it was spent in started: a sample of an earlier
	// window counts as a reset to zero, as a counter's reset does in a rate.
	WindowStart metav1.Time `json:"windowStart"`
	// SpentMicros is the spend in millionths of the window's unit.
	// +kubebuilder:validation:Minimum=0
	SpentMicros int64 `json:"spentMicros"`
}
