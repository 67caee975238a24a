// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package v1alpha1

import (
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Dimension is what a budget is counted per.
// +kubebuilder:validation:Enum=Global;PerClient;PerAPIKey;PerUser;PerTeam;PerModel;PerTenant
type Dimension string

// The dimensions.
const (
	DimensionGlobal    Dimension = "Global"
	DimensionPerClient Dimension = "PerClient"
	DimensionPerAPIKey Dimension = "PerAPIKey"
	DimensionPerUser   Dimension = "PerUser"
	DimensionPerTeam   Dimension = "PerTeam"
	DimensionPerModel  Dimension = "PerModel"
	// DimensionPerTenant counts each tenant namespace's keys together: the platform's
	// cap on a tenant as a whole. Only a budget in the fleet's namespace may set it.
	DimensionPerTenant Dimension = "PerTenant"
)

// CountBy is the second attribute a budget fans out by: a counter per (subject,
// value) pair, for example per key per model, or per key per session.
// +kubebuilder:validation:Enum=APIKey;User;Team;Model;Client;Tenant;Provider;Endpoint;Environment;Session;Agent;Task;Run;RequestFingerprint
type CountBy string

// The attributes a budget fans out by.
const (
	CountByAPIKey CountBy = "APIKey"
	CountByUser   CountBy = "User"
	CountByTeam   CountBy = "Team"
	CountByModel  CountBy = "Model"
	CountByClient CountBy = "Client"
	// CountByTenant fans a budget out by tenant namespace (the fleet's namespace only).
	CountByTenant CountBy = "Tenant"
	// CountByProvider fans out by the upstream that serves the request.
	CountByProvider CountBy = "Provider"
	// CountByEndpoint fans out by route family: ChatCompletions, Completions,
	// Responses, Messages.
	CountByEndpoint CountBy = "Endpoint"
	// CountByEnvironment fans out by the key's environment, which the platform sets
	// (the label tokenwarden.io/environment of the key's namespace).
	CountByEnvironment CountBy = "Environment"
	// CountBySession, CountByAgent, CountByTask and CountByRun fan out by the client's
	// headers x-tokenwarden-session-id, -agent-id, -task-id and -run-id, always under
	// the key that sent them.
	CountBySession CountBy = "Session"
	CountByAgent   CountBy = "Agent"
	CountByTask    CountBy = "Task"
	CountByRun     CountBy = "Run"
	// CountByRequestFingerprint fans out by the hash of the request as forwarded (the
	// response cache's key): identical requests of a key share a counter.
	CountByRequestFingerprint CountBy = "RequestFingerprint"
)

// AttributeSelector selects the requests whose attribute holds one of its values.
type AttributeSelector struct {
	// Attribute is Tenant, APIKey, User, Team, Model, Client, Provider (the serving
	// upstream's provider family, OpenAI or Anthropic, or its name), Endpoint
	// (ChatCompletions, Completions, Responses, Messages), Environment, Session, Agent,
	// Task, Run or RequestFingerprint.
	// +required
	Attribute CountBy `json:"attribute"`
	// Values are the values that select a request; a team, user or key of a tenant
	// namespace is read in that namespace, as subjects are.
	// +required
	// +listType=set
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=256
	Values []string `json:"values"`
}

// Amount is what a budget counts.
// +kubebuilder:validation:Enum=Tokens;InputTokens;OutputTokens;Requests;Cost;InFlight
type Amount string

// Amounts.
const (
	// AmountTokens counts input plus output tokens, as tokensPerMinute and tokensPerDay do.
	AmountTokens Amount = "Tokens"
	// AmountInputTokens counts input (prompt) tokens only.
	AmountInputTokens Amount = "InputTokens"
	// AmountOutputTokens counts generated tokens only.
	AmountOutputTokens Amount = "OutputTokens"
	// AmountRequests counts requests.
	AmountRequests Amount = "Requests"
	// AmountCost counts US dollars, priced from the fleet's spec.models.
	AmountCost Amount = "Cost"
	// AmountInFlight counts the requests in flight now, from admission until each
	// ends: one window, its limit alone, never divided among replicas.
	AmountInFlight Amount = "InFlight"
)

// Action is what happens when a request does not fit a budget.
// +kubebuilder:validation:Enum=Block;Warn
type Action string

// Actions.
const (
	// ActionBlock refuses the request (429).
	ActionBlock Action = "Block"
	// ActionWarn admits it, counts and exports the would-be refusal and reports it in
	// a response header: a budget watched before it is enforced.
	ActionWarn Action = "Warn"
)

// Period is a rolling window's length.
// +kubebuilder:validation:Enum=Second;Minute;Hour;Day
type Period string

// Periods.
const (
	PeriodSecond Period = "Second"
	PeriodMinute Period = "Minute"
	PeriodHour   Period = "Hour"
	PeriodDay    Period = "Day"
)

// CalendarUnit is how often a calendar window starts.
// +kubebuilder:validation:Enum=Day;Week;Month
type CalendarUnit string

// Calendar units.
const (
	EveryDay   CalendarUnit = "Day"
	EveryWeek  CalendarUnit = "Week"
	EveryMonth CalendarUnit = "Month"
)

// Weekday is the day a weekly window starts.
// +kubebuilder:validation:Enum=Monday;Tuesday;Wednesday;Thursday;Friday;Saturday;Sunday
type Weekday string

// BudgetWindow is one limit of a budget over one window: rolling (a bucket refilled
// continuously) or calendar (a counter that starts at zero at an anchor); an InFlight
// budget's one window is its limit alone.
// +kubebuilder:validation:XValidation:rule="!(has(self.rolling) && has(self.calendar))",message="set exactly one of rolling and calendar (an InFlight budget's window sets neither)"
// +kubebuilder:validation:XValidation:rule="quantity(string(self.limit)).isGreaterThan(quantity('0'))",message="limit must be above 0"
type BudgetWindow struct {
	// Limit is the allowance per window, in the budget's amount: tokens, requests
	// (whole numbers) or US dollars ("25.50"). A quantity: 600k, 1.5M and 1000 work.
	// It is a fleet total; under memory storage each replica enforces its share of a
	// rolling window.
	// +required
	Limit resource.Quantity `json:"limit"`
	// Rolling is a bucket refilled at limit per period.
	// +optional
	Rolling *RollingWindow `json:"rolling,omitempty"`
	// Calendar is a counter that starts at zero every day, week or month (needs a
	// fleet with Redis storage: it must never reset to full because a proxy restarted).
	// +optional
	Calendar *CalendarWindow `json:"calendar,omitempty"`
}

// RollingWindow is a bucket refilled continuously at limit per period.
type RollingWindow struct {
	// Period is Second, Minute, Hour or Day.
	// +required
	Period Period `json:"period"`
	// BurstSeconds is how many seconds of refill the bucket holds: the burst it
	// absorbs. 0 or absent: one period (the bucket holds one period's limit).
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=2678400
	BurstSeconds int64 `json:"burstSeconds,omitempty"`
}

// CalendarWindow is a counter that starts at zero at an anchor in a time zone: every
// day at a time of day, every week on a weekday, every month on a day of the month
// (the month's last day when it is shorter). A daylight-saving change moves the
// instant, never the wall-clock anchor.
// +kubebuilder:validation:XValidation:rule="!has(self.weekday) || self.every == 'Week'",message="weekday applies only to every: Week"
// +kubebuilder:validation:XValidation:rule="!has(self.dayOfMonth) || self.every == 'Month'",message="dayOfMonth applies only to every: Month"
type CalendarWindow struct {
	// Every is Day, Week or Month.
	// +required
	Every CalendarUnit `json:"every"`
	// TimeZone is an IANA time zone name, for example Europe/Berlin. Default UTC.
	// +optional
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:XValidation:rule="self.matches('^[A-Za-z][A-Za-z0-9_+-]*(/[A-Za-z0-9_+-]+){0,2}$')",message="timeZone must be an IANA time zone name such as UTC or Europe/Berlin"
	TimeZone string `json:"timeZone,omitempty"`
	// At is the wall-clock time the window starts, HH:MM. Default 00:00.
	// +optional
	// +kubebuilder:validation:MaxLength=5
	// +kubebuilder:validation:XValidation:rule="self.matches('^([01][0-9]|2[0-3]):[0-5][0-9]$')",message="at must be a time of day HH:MM, such as 00:00 or 09:30"
	At string `json:"at,omitempty"`
	// Weekday starts a weekly window: Monday to Sunday. Default Monday.
	// +optional
	Weekday Weekday `json:"weekday,omitempty"`
	// DayOfMonth starts a monthly window: 1 to 31 (the month's last day when it is
	// shorter). Default 1.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=31
	DayOfMonth int32 `json:"dayOfMonth,omitempty"`
}

// TokenBudgetSpec is one budget of one fleet. Every number is a fleet total; the
// operator divides it among the replicas when storage is memory.
//
// The limits shape (one dimension, tokensPerMinute, tokensPerDay,
// requestsPerSecond) renders into the proxy config's limits, as it always has. A budget
// that sets any of subjects, countBy, models, windows, an amount other than Tokens or
// the action Warn renders into the config's rules instead (docs/budgets.md); its
// shorthand fields are then windows too.
// +kubebuilder:validation:XValidation:rule="self.dimension == 'PerModel' ? (has(self.model) ? !has(self.subjects) : (has(self.subjects) || has(self.windows))) : !has(self.model)",message="model is required when dimension is PerModel and must not be set otherwise (a PerModel budget may name its models in subjects instead, or, with windows, none for each model)"
// +kubebuilder:validation:XValidation:rule="has(self.windows) || self.tokensPerMinute > 0 || self.tokensPerDay > 0 || self.requestsPerSecond > 0",message="at least one of tokensPerMinute, tokensPerDay and requestsPerSecond must be positive, or windows set"
// +kubebuilder:validation:XValidation:rule="self.burstCapacity == 0 || self.requestsPerSecond > 0",message="burstCapacity needs requestsPerSecond"
// +kubebuilder:validation:XValidation:rule="!has(self.windows) || self.tokensPerMinute == 0",message="tokensPerMinute must be 0 when windows are set: write the minute as a window"
// +kubebuilder:validation:XValidation:rule="!has(self.windows) || self.tokensPerDay == 0",message="tokensPerDay must be 0 when windows are set: write the day as a window"
// +kubebuilder:validation:XValidation:rule="!has(self.windows) || self.requestsPerSecond == 0",message="requestsPerSecond must be 0 when windows are set: write a Requests budget with a window"
// +kubebuilder:validation:XValidation:rule="!has(self.windows) || self.burstCapacity == 0",message="burstCapacity must be 0 when windows are set: set a window's rolling.burstSeconds"
// +kubebuilder:validation:XValidation:rule="self.dimension != 'Global' || !has(self.subjects)",message="subjects must not be set on a Global budget: it has one subject, the whole fleet"
// +kubebuilder:validation:XValidation:rule="!has(self.countBy) || 'Per' + self.countBy != self.dimension",message="countBy must differ from the dimension: the budget already counts each subject of its dimension"
// +kubebuilder:validation:XValidation:rule="!has(self.amount) || !(self.amount in ['Requests', 'Cost']) || (self.tokensPerMinute == 0 && self.tokensPerDay == 0)",message="tokensPerMinute and tokensPerDay count tokens: a Requests or Cost budget writes its limits in windows"
// +kubebuilder:validation:XValidation:rule="!has(self.amount) || !(self.amount in ['InputTokens', 'OutputTokens', 'Cost']) || has(self.windows) || self.tokensPerMinute > 0 || self.tokensPerDay > 0",message="amount needs windows (or, for InputTokens and OutputTokens, tokensPerMinute or tokensPerDay): requestsPerSecond counts requests only"
// +kubebuilder:validation:XValidation:rule="!has(self.windows) || (has(self.amount) && self.amount == 'Cost') || self.windows.all(w, quantity(string(w.limit)).isInteger())",message="windows[].limit must be a whole number of tokens or requests: only a Cost budget (US dollars) counts fractions"
// +kubebuilder:validation:XValidation:rule="!has(self.appliesWhen) || !has(self.models) || !self.appliesWhen.exists(a, a.attribute == 'Model')",message="models already selects the models: write them in models or in appliesWhen, not both"
// +kubebuilder:validation:XValidation:rule="!has(self.fallbackModel) || (self.dimension == 'PerModel' && !has(self.countBy))",message="fallbackModel applies only to a PerModel budget without countBy: a budget of a tenant refuses whatever the model"
// +kubebuilder:validation:XValidation:rule="!has(self.windows) || (has(self.amount) && self.amount == 'InFlight') || self.windows.all(w, has(w.rolling) || has(w.calendar))",message="windows[] must each set rolling or calendar: only an InFlight budget's window is its limit alone",fieldPath=".windows"
// +kubebuilder:validation:XValidation:rule="!has(self.amount) || self.amount != 'InFlight' || (has(self.windows) && size(self.windows) == 1 && !has(self.windows[0].rolling) && !has(self.windows[0].calendar))",message="amount InFlight needs windows of one entry, its limit alone (no rolling, no calendar): what is in flight is counted now, not over a period",fieldPath=".windows"
// +kubebuilder:validation:XValidation:rule="!has(self.amount) || self.amount != 'InFlight' || !has(self.action) || self.action == 'Block'",message="amount InFlight blocks: action Warn is not supported for it",fieldPath=".action"
type TokenBudgetSpec struct {
	// ProxyRef is the TokenProxy (fleet) this budget applies to.
	// +required
	ProxyRef ProxyReference `json:"proxyRef"`

	// Dimension is what the budget is counted per: Global (the whole fleet, or in a
	// tenant namespace of a Namespaces fleet every key of that tenant), PerClient
	// (client address), PerAPIKey, PerUser, PerTeam, PerModel or PerTenant (each tenant
	// namespace as a whole; only in the fleet's own namespace).
	// +required
	Dimension Dimension `json:"dimension"`

	// Model is the client-facing model name of a PerModel budget; set exactly when
	// the dimension is PerModel.
	// +optional
	// +kubebuilder:validation:MaxLength=256
	Model string `json:"model,omitempty"`

	// Subjects are the subjects of the dimension this budget applies to: team names
	// (PerTeam), user names (PerUser), ApiKey names (PerAPIKey: the name in the
	// fleet's namespace, namespace/name in another), client addresses (PerClient) or
	// model names (PerModel). Empty: each subject of the dimension. A budget that names
	// subjects replaces, for them, the each-subject budget of the same dimension,
	// countBy, models, amount and window period ("research 600k, every other team
	// 50k"). Not for Global.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=253
	Subjects []string `json:"subjects,omitempty"`

	// CountBy fans the budget out by a second attribute: APIKey, User, Team, Model,
	// Client, Tenant (only in the fleet's own namespace), Provider, Endpoint,
	// Environment, Session, Agent, Task, Run or RequestFingerprint; each (subject,
	// value) pair has its own counter ("per key per model"). A value the client sends
	// (Session, Agent, Task, Run, RequestFingerprint) is counted under the key that
	// sent it. Empty: one counter per subject.
	// +optional
	CountBy CountBy `json:"countBy,omitempty"`

	// AppliesWhen restricts the budget to the requests whose every listed attribute
	// holds one of its values ("only chat completions of agent planner"). Empty: every
	// request.
	// +optional
	// +listType=map
	// +listMapKey=attribute
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=14
	AppliesWhen []AttributeSelector `json:"appliesWhen,omitempty"`

	// Models restricts the budget to requests for these client-facing models. Empty:
	// every model.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=256
	Models []string `json:"models,omitempty"`

	// Amount is what the budget counts: Tokens (input plus output), InputTokens,
	// OutputTokens, Requests, Cost (US dollars, priced from the fleet's spec.models;
	// needs a fleet with Redis storage) or InFlight (requests in flight now, from
	// admission until each ends: windows is one entry, its limit alone; the fleet's
	// total under Redis storage, each replica's own, never divided, under memory
	// storage). Default Tokens.
	// +optional
	Amount Amount `json:"amount,omitempty"`

	// Action is what happens at the limit: Block (refuse with 429) or Warn (admit,
	// count, export and add a warning header: watch a budget before enforcing it).
	// Default Block.
	// +optional
	Action Action `json:"action,omitempty"`

	// Windows are the budget's limits, each over its own window; every one applies.
	// With windows set, the shorthand fields (tokensPerMinute, tokensPerDay,
	// requestsPerSecond, burstCapacity) must be 0.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=8
	Windows []BudgetWindow `json:"windows,omitempty"`

	// TokensPerMinute is the minute budget in tokens: a bucket of one minute of the
	// rate, refilled continuously. 0 is unlimited. Default 0.
	// +optional
	// +kubebuilder:default=0
	// +kubebuilder:validation:Minimum=0
	TokensPerMinute int64 `json:"tokensPerMinute"`

	// TokensPerDay is the day budget in tokens: a bucket of one day of the rate,
	// refilled continuously (it does not reset at midnight). 0 is unlimited. Default 0.
	// +optional
	// +kubebuilder:default=0
	// +kubebuilder:validation:Minimum=0
	TokensPerDay int64 `json:"tokensPerDay"`

	// RequestsPerSecond is the request rate per replica. 0 is unlimited. Default 0.
	// On a budget that renders into rules it is a window of one second on the
	// Requests amount, a fleet total like every window.
	// +optional
	// +kubebuilder:default=0
	// +kubebuilder:validation:Minimum=0
	RequestsPerSecond int64 `json:"requestsPerSecond"`

	// BurstCapacity is the request bucket's size (default: one second of the rate).
	// +optional
	// +kubebuilder:default=0
	// +kubebuilder:validation:Minimum=0
	BurstCapacity int64 `json:"burstCapacity"`

	// FallbackModel, on a PerModel budget, serves a request the budget refuses with
	// this cheaper model of the fleet's spec.models instead of a 429, charged to that
	// model's budgets; the answer's x-tokenwarden-fallback header says so. A budget
	// of a tenant never falls back. Default: none (the budget refuses).
	// +optional
	// +kubebuilder:validation:MaxLength=256
	FallbackModel string `json:"fallbackModel,omitempty"`
}

// PerReplicaAllowance is what each replica enforces.
type PerReplicaAllowance struct {
	// TokensPerMinute each replica enforces; absent when unlimited.
	// +optional
	TokensPerMinute *int64 `json:"tokensPerMinute,omitempty"`
	// TokensPerDay each replica enforces; absent when unlimited.
	// +optional
	TokensPerDay *int64 `json:"tokensPerDay,omitempty"`
}

// TokenBudgetStatus is what the operator observed and enforces.
type TokenBudgetStatus struct {
	// ObservedGeneration is the generation this status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Replicas is the divisor in force: the fleet's replica count under memory
	// storage, 1 under Redis (the shared buckets hold the total).
	// +optional
	Replicas int64 `json:"replicas,omitempty"`
	// PerReplica is the allowance each replica enforces (the shared total under Redis).
	// +optional
	PerReplica PerReplicaAllowance `json:"perReplica,omitempty"`
	// Storage is the fleet's storage: Memory or Redis.
	// +optional
	Storage StorageType `json:"storage,omitempty"`
	// ConfigGeneration is the generation of the fleet's config that first held this
	// budget's current content; 0 while it is not in the config. The budget is
	// Enforced once every live replica has loaded this generation or a later one.
	// +optional
	ConfigGeneration int64 `json:"configGeneration,omitempty"`
	// Conditions: Accepted (valid, its fleet exists, no conflict), Ready (in the
	// rendered config), Enforced (loaded by every live replica) and, with a calendar
	// window, ProjectedToRunOut (status.forecast).
	// +optional
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=8
	Conditions []metav1.Condition `json:"conditions,omitempty"`
	// Summary is the budget in words, for kubectl get: whom it applies to, what it
	// counts, its windows and what each replica enforces.
	// +optional
	Summary BudgetSummary `json:"summary,omitempty"`

	// Live usage (tokenbudget_usage_types.go).

	// Usage is the fleet's live use of the budget, summed from the proxy replicas'
	// usage reports; absent until the budget is first used.
	// +optional
	Usage *TokenBudgetUsage `json:"usage,omitempty"`
	// Forecast is, for a budget with a calendar window, the first calendar window's
	// spend and its projection at the last hour's burn rate; absent until the window
	// is first spent from.
	// +optional
	Forecast *BudgetForecast `json:"forecast,omitempty"`
}

// BudgetSummary is a budget written out for people: the columns of kubectl get.
type BudgetSummary struct {
	// Subjects is whom the budget applies to: "research,support", "each team", "each
	// key per model", "fleet".
	// +optional
	// +kubebuilder:validation:MaxLength=512
	Subjects string `json:"subjects,omitempty"`
	// AppliesWhen is which requests it governs beyond its subjects:
	// "endpoint=chat_completions agent=planner"; empty for every request.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	AppliesWhen string `json:"appliesWhen,omitempty"`
	// CountBy is what it fans out by within each subject: "session"; empty for none.
	// +optional
	// +kubebuilder:validation:MaxLength=64
	CountBy string `json:"countBy,omitempty"`
	// Amount is what it counts: tokens, input tokens, output tokens, requests or cost.
	// +optional
	// +kubebuilder:validation:MaxLength=64
	Amount string `json:"amount,omitempty"`
	// Windows are its limits: "600k/min burst 20s, $1000/month".
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	Windows string `json:"windows,omitempty"`
	// Action is Block or Warn.
	// +optional
	// +kubebuilder:validation:MaxLength=16
	Action string `json:"action,omitempty"`
	// PerReplica is what each replica enforces of every window: the share of a
	// rolling window under memory storage, the fleet total under Redis (the replicas
	// share the counters). Empty while the budget is not in force.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	PerReplica string `json:"perReplica,omitempty"`
}

// TokenBudget is a budget on one dimension of a fleet: tokens, requests or dollars,
// over rolling or calendar windows, for each subject or named ones.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=tb,categories=tokenwarden
// +kubebuilder:printcolumn:name="Dimension",type=string,JSONPath=`.spec.dimension`
// +kubebuilder:printcolumn:name="Subjects",type=string,JSONPath=`.status.summary.subjects`
// +kubebuilder:printcolumn:name="Applies When",type=string,JSONPath=`.status.summary.appliesWhen`
// +kubebuilder:printcolumn:name="Count By",type=string,JSONPath=`.status.summary.countBy`
// +kubebuilder:printcolumn:name="Amount",type=string,JSONPath=`.status.summary.amount`
// +kubebuilder:printcolumn:name="Windows",type=string,JSONPath=`.status.summary.windows`
// +kubebuilder:printcolumn:name="Action",type=string,JSONPath=`.status.summary.action`
// +kubebuilder:printcolumn:name="Replicas",type=integer,JSONPath=`.status.replicas`
// +kubebuilder:printcolumn:name="Per-Replica",type=string,JSONPath=`.status.summary.perReplica`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Used",type=string,JSONPath=`.status.usage.used`
// +kubebuilder:printcolumn:name="At Limit",type=integer,JSONPath=`.status.usage.subjectsAtLimit`
// +kubebuilder:printcolumn:name="Spent",type=string,JSONPath=`.status.forecast.spent`
// +kubebuilder:printcolumn:name="Projected",type=string,JSONPath=`.status.forecast.projected`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:printcolumn:name="Top Consumer",type=string,JSONPath=`.status.usage.topConsumer`,priority=1
// +kubebuilder:printcolumn:name="Runs Out",type=string,JSONPath=`.status.forecast.runsOutAt`,priority=1
// +kubebuilder:printcolumn:name="Resets",type=string,JSONPath=`.status.forecast.resetsAt`,priority=1
// +kubebuilder:printcolumn:name="Model",type=string,JSONPath=`.spec.model`,priority=1
// +kubebuilder:printcolumn:name="TPM",type=integer,JSONPath=`.spec.tokensPerMinute`,priority=1
// +kubebuilder:printcolumn:name="TPD",type=integer,JSONPath=`.spec.tokensPerDay`,priority=1
// +kubebuilder:printcolumn:name="Per-Replica TPM",type=integer,JSONPath=`.status.perReplica.tokensPerMinute`,priority=1
// +kubebuilder:printcolumn:name="Per-Replica TPD",type=integer,JSONPath=`.status.perReplica.tokensPerDay`,priority=1
type TokenBudget struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +required
	Spec TokenBudgetSpec `json:"spec"`
	// +optional
	Status TokenBudgetStatus `json:"status,omitempty"`
}

// TokenBudgetList is a list of TokenBudgets.
// +kubebuilder:object:root=true
type TokenBudgetList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []TokenBudget `json:"items"`
}
