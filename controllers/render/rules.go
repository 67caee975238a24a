// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package render

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"

	twv1alpha1 "github.com/tokenwarden/tokenwarden/api/v1alpha1"
	"github.com/tokenwarden/tokenwarden/proxy/config"
)

// A TokenBudget has two shapes. The limits shape (a dimension and tokensPerMinute,
// tokensPerDay, requestsPerSecond) renders into the config's limits exactly as it
// always has. A budget that sets subjects, countBy, models, windows, an amount other
// than Tokens or the action Warn renders into rate_limiting.rules: one rule per amount,
// named <namespace>/<name> (the shorthand's request rate, beside a token amount, is a
// second rule named <namespace>/<name>/requests).

// RulesShaped reports whether a budget renders into rules.
func RulesShaped(b *twv1alpha1.TokenBudget) bool {
	s := &b.Spec
	return len(s.Subjects) > 0 || s.CountBy != "" || len(s.Models) > 0 || len(s.AppliesWhen) > 0 || len(s.Windows) > 0 || s.Dimension == twv1alpha1.DimensionPerTenant ||
		(s.Amount != "" && s.Amount != twv1alpha1.AmountTokens) || s.Action == twv1alpha1.ActionWarn || s.FallbackModel != ""
}

// AmountOf is a budget's amount, defaulted.
func AmountOf(b *twv1alpha1.TokenBudget) twv1alpha1.Amount {
	if b.Spec.Amount == "" {
		return twv1alpha1.AmountTokens
	}
	return b.Spec.Amount
}

// actionOf is a budget's action, defaulted.
func actionOf(b *twv1alpha1.TokenBudget) twv1alpha1.Action {
	if b.Spec.Action == "" {
		return twv1alpha1.ActionBlock
	}
	return b.Spec.Action
}

// RuleGroup is the windows of one amount of a budget: one rule.
type RuleGroup struct {
	Suffix  string
	Amount  twv1alpha1.Amount
	Windows []config.Window
}

// Groups are a budget's windows by amount: its windows, or the windows its shorthand
// fields stand for (the token fields count the budget's amount, requestsPerSecond
// counts requests, with burstCapacity as the bucket's burst).
func Groups(b *twv1alpha1.TokenBudget) []RuleGroup {
	s := &b.Spec
	amount := AmountOf(b)
	if len(s.Windows) > 0 {
		g := RuleGroup{Amount: amount}
		for _, w := range s.Windows {
			g.Windows = append(g.Windows, configWindow(w))
		}
		return []RuleGroup{g}
	}
	main := RuleGroup{Amount: amount}
	if s.TokensPerMinute > 0 {
		main.Windows = append(main.Windows, config.Window{Limit: float64(s.TokensPerMinute), Rolling: &config.Rolling{Period: config.PeriodMinute}})
	}
	if s.TokensPerDay > 0 {
		main.Windows = append(main.Windows, config.Window{Limit: float64(s.TokensPerDay), Rolling: &config.Rolling{Period: config.PeriodDay}})
	}
	var out []RuleGroup
	if len(main.Windows) > 0 {
		out = append(out, main)
	}
	if s.RequestsPerSecond > 0 {
		w := config.Window{Limit: float64(s.RequestsPerSecond), Rolling: &config.Rolling{Period: config.PeriodSecond}}
		if s.BurstCapacity > 0 {
			w.Rolling.BurstSeconds = float64(s.BurstCapacity) / float64(s.RequestsPerSecond)
		}
		switch {
		case amount == twv1alpha1.AmountRequests:
			main.Windows = append(main.Windows, w)
			out = []RuleGroup{main}
		case len(out) > 0:
			out = append(out, RuleGroup{Suffix: "/requests", Amount: twv1alpha1.AmountRequests, Windows: []config.Window{w}})
		default:
			out = append(out, RuleGroup{Amount: twv1alpha1.AmountRequests, Windows: []config.Window{w}})
		}
	}
	return out
}

func configWindow(w twv1alpha1.BudgetWindow) config.Window {
	out := config.Window{Limit: quantityFloat(w.Limit)}
	if r := w.Rolling; r != nil {
		out.Rolling = &config.Rolling{Period: config.Period(strings.ToLower(string(r.Period))), BurstSeconds: float64(r.BurstSeconds)}
	}
	if c := w.Calendar; c != nil {
		out.Calendar = &config.Calendar{
			Every: config.CalendarUnit(strings.ToLower(string(c.Every))), TimeZone: c.TimeZone, At: c.At,
			Weekday: strings.ToLower(string(c.Weekday)), DayOfMonth: int(c.DayOfMonth),
		}
	}
	return out
}

// quantityFloat is a quantity as the nearest float64: "25.50" is 25.5, "600k" 600000.
func quantityFloat(q resource.Quantity) float64 {
	f, err := strconv.ParseFloat(q.AsDec().String(), 64)
	if err != nil {
		return q.AsApproximateFloat64()
	}
	return f
}

var ruleDimensions = map[twv1alpha1.Dimension]config.RuleDimension{
	twv1alpha1.DimensionGlobal: config.RuleGlobal, twv1alpha1.DimensionPerClient: config.RuleClient,
	twv1alpha1.DimensionPerAPIKey: config.RuleAPIKey, twv1alpha1.DimensionPerUser: config.RuleUser,
	twv1alpha1.DimensionPerTeam: config.RuleTeam, twv1alpha1.DimensionPerModel: config.RuleModel,
	twv1alpha1.DimensionPerTenant: config.RuleTenant,
}

var configAmounts = map[twv1alpha1.Amount]config.Amount{
	twv1alpha1.AmountTokens: config.AmountTokens, twv1alpha1.AmountInputTokens: config.AmountInputTokens,
	twv1alpha1.AmountOutputTokens: config.AmountOutputTokens, twv1alpha1.AmountRequests: config.AmountRequests,
	twv1alpha1.AmountCost: config.AmountCost, twv1alpha1.AmountInFlight: config.AmountInFlight,
}

// SubjectsOf are the budget's named subjects: its subjects, or a PerModel budget's
// model; none for each subject.
func SubjectsOf(b *twv1alpha1.TokenBudget) []string {
	if len(b.Spec.Subjects) > 0 {
		return b.Spec.Subjects
	}
	if b.Spec.Model != "" {
		return []string{b.Spec.Model}
	}
	return nil
}

// budgetRules renders a budget into rules. ApiKey subjects are the keys' names in
// the config: a key of the fleet's namespace is its name there (namespace/name works
// too), a key of another namespace namespace_name. A tenant's budget is a rule of its
// tenant, and its subjects are its own: a key named name is its namespace's, a team or
// user is qualified by its namespace.
func budgetRules(tp *twv1alpha1.TokenProxy, b *twv1alpha1.TokenBudget) []config.Rule {
	s := &b.Spec
	dim := ruleDimensions[s.Dimension]
	subjects := slices.Clone(SubjectsOf(b))
	tenant := ""
	if Scoped(tp, b) {
		tenant = b.Namespace
	}
	for i, subj := range subjects {
		switch {
		case dim == config.RuleAPIKey:
			subjects[i] = keySubject(b, tenant, subj)
		case (dim == config.RuleTeam || dim == config.RuleUser) && tenant != "":
			subjects[i] = qualifiedSubject(tenant, subj)
		}
	}
	var out []config.Rule
	for _, g := range Groups(b) {
		out = append(out, config.Rule{
			Name:        b.Namespace + "/" + b.Name + g.Suffix,
			Tenant:      tenant,
			Dimension:   dim,
			Subjects:    subjects,
			CountBy:     attributeWords[s.CountBy],
			Models:      slices.Clone(s.Models),
			AppliesWhen: appliesWhen(tp, b),
			Amount:      configAmounts[g.Amount],
			Action:      config.Action(strings.ToLower(string(actionOf(b)))),
			Windows:     g.Windows,
			// A model's fallback (models.go).
			FallbackModel: s.FallbackModel,
		})
	}
	return out
}

// Durable reports whether a budget must not lose its state: a calendar window or a
// Cost amount, which only Redis holds durably.
func Durable(b *twv1alpha1.TokenBudget) bool {
	return AmountOf(b) == twv1alpha1.AmountCost ||
		slices.ContainsFunc(b.Spec.Windows, func(w twv1alpha1.BudgetWindow) bool { return w.Calendar != nil })
}

// slot is one counter a budget sets, on which two budgets conflict.
type slot struct {
	key string
	// what describes it in the loser's message.
	what string
}

var dimensionNouns = map[twv1alpha1.Dimension]string{
	twv1alpha1.DimensionGlobal: "fleet", twv1alpha1.DimensionPerClient: "client", twv1alpha1.DimensionPerAPIKey: "key",
	twv1alpha1.DimensionPerUser: "user", twv1alpha1.DimensionPerTeam: "team", twv1alpha1.DimensionPerModel: "model",
	twv1alpha1.DimensionPerTenant: "tenant",
}

var countByNouns = map[twv1alpha1.CountBy]string{
	twv1alpha1.CountByAPIKey: "key", twv1alpha1.CountByUser: "user", twv1alpha1.CountByTeam: "team",
	twv1alpha1.CountByModel: "model", twv1alpha1.CountByClient: "client", twv1alpha1.CountByTenant: "tenant",
	twv1alpha1.CountByProvider: "provider", twv1alpha1.CountByEndpoint: "endpoint", twv1alpha1.CountByEnvironment: "environment",
	twv1alpha1.CountBySession: "session", twv1alpha1.CountByAgent: "agent", twv1alpha1.CountByTask: "task",
	twv1alpha1.CountByRun: "run", twv1alpha1.CountByRequestFingerprint: "identical request",
}

var amountWords = map[twv1alpha1.Amount]string{
	twv1alpha1.AmountTokens: "tokens", twv1alpha1.AmountInputTokens: "input tokens", twv1alpha1.AmountOutputTokens: "output tokens",
	twv1alpha1.AmountRequests: "requests", twv1alpha1.AmountCost: "cost", twv1alpha1.AmountInFlight: "requests in flight",
}

// slots are the counters a budget sets: one per subject (or each subject), amount and
// window, for its dimension, countBy, models and action. A budget of the limits shape
// also holds its dimension's place in the config's limits, which one such budget
// fills. Two budgets that share a slot conflict; a named-subject budget and an
// each-subject one do not (the named one takes precedence for its subjects), nor a Warn
// budget and a Block one (the way a budget is tried before it is enforced).
func slots(tp *twv1alpha1.TokenProxy, b *twv1alpha1.TokenBudget) []slot {
	s := &b.Spec
	var out []slot
	// A tenant's slots are its own: budgets conflict only within one level.
	level := ""
	if Scoped(tp, b) {
		level = b.Namespace + "|"
	}
	if !RendersAsRules(tp, b) {
		what := "the same dimension " + string(s.Dimension)
		if s.Model != "" {
			what += " for model " + s.Model
		}
		out = append(out, slot{key: "limits|" + string(s.Dimension) + "|" + s.Model, what: what})
	}
	models := slices.Clone(s.Models)
	slices.Sort(models)
	scope := ""
	if s.CountBy != "" {
		scope += " per " + countByNouns[s.CountBy]
	}
	if len(models) > 0 {
		scope += " on " + strings.Join(models, ",")
	}
	when := AppliesWhenText(tp, b)
	if when != "" {
		scope += " when " + when
	}
	subjects := SubjectsOf(b)
	each := len(subjects) == 0
	if each {
		subjects = []string{""}
	}
	for _, g := range Groups(b) {
		for _, w := range g.Windows {
			for _, subj := range subjects {
				who := "each " + dimensionNouns[s.Dimension]
				switch {
				case s.Dimension == twv1alpha1.DimensionGlobal && level != "":
					who = "every key of " + b.Namespace
				case s.Dimension == twv1alpha1.DimensionGlobal:
					who = "the fleet"
				case !each:
					who = dimensionNouns[s.Dimension] + " " + subj
				}
				key := level + strings.Join([]string{string(s.Dimension), string(s.CountBy), strings.Join(models, ","), when, subj,
					string(g.Amount), windowKey(w), string(actionOf(b))}, "|")
				what := fmt.Sprintf("the same budget: %s%s, %s per %s", who, scope, amountWords[g.Amount], windowWord(w))
				if actionOf(b) == twv1alpha1.ActionWarn {
					what += " (warn)"
				}
				out = append(out, slot{key: key, what: what})
			}
		}
	}
	return out
}

func windowKey(w config.Window) string {
	switch {
	case w.Rolling != nil:
		return "rolling/" + string(w.Rolling.Period)
	case w.Calendar != nil:
		return "calendar/" + string(w.Calendar.Every)
	}
	return "now"
}

func windowWord(w config.Window) string {
	switch {
	case w.Rolling != nil:
		return string(w.Rolling.Period)
	case w.Calendar != nil:
		return "calendar " + string(w.Calendar.Every)
	}
	return "moment"
}

// Summary is a budget in words, for kubectl get; perReplica only when it is in force,
// with each replica's share under memory storage (divisor) and the fleet total under
// Redis (divisor 1). tp is the budget's fleet; nil when there is none.
func Summary(tp *twv1alpha1.TokenProxy, b *twv1alpha1.TokenBudget, inForce bool, divisor int64) twv1alpha1.BudgetSummary {
	rules, scoped := RendersAsRules(tp, b), Scoped(tp, b)
	s := &b.Spec
	sum := twv1alpha1.BudgetSummary{Action: string(actionOf(b))}
	switch subjects := SubjectsOf(b); {
	case s.Dimension == twv1alpha1.DimensionGlobal && scoped:
		sum.Subjects = "tenant " + b.Namespace
	case s.Dimension == twv1alpha1.DimensionGlobal:
		sum.Subjects = "fleet"
	case len(subjects) > 0:
		sum.Subjects = strings.Join(subjects, ",")
	default:
		sum.Subjects = "each " + dimensionNouns[s.Dimension]
	}
	if s.CountBy != "" {
		sum.Subjects += " per " + countByNouns[s.CountBy]
	}
	if len(s.Models) > 0 {
		sum.Subjects += " on " + strings.Join(s.Models, ",")
	}
	sum.AppliesWhen, sum.CountBy = AppliesWhenText(tp, b), CountByText(b)
	gs := Groups(b)
	var amounts, windows, shares []string
	for _, g := range gs {
		amounts = append(amounts, amountWords[g.Amount])
		for _, w := range g.Windows {
			windows = append(windows, WindowText(g.Amount, w, w.Limit))
			share := w.Limit
			// The limits shape's request rate is each replica's; every other rolling window
			// is a fleet total, divided under memory storage.
			perReplicaRate := !rules && g.Amount == twv1alpha1.AmountRequests
			if w.Rolling != nil && !perReplicaRate && divisor > 1 {
				share = w.Limit / float64(divisor)
				if g.Amount != twv1alpha1.AmountCost {
					share = math.Floor(share)
				}
			}
			shares = append(shares, WindowText(g.Amount, w, share))
		}
	}
	sum.Amount = strings.Join(amounts, ", ")
	sum.Windows = strings.Join(windows, ", ")
	if inForce {
		sum.PerReplica = strings.Join(shares, ", ")
	}
	return sum
}

var periodUnits = map[config.Period]string{config.PeriodSecond: "s", config.PeriodMinute: "min", config.PeriodHour: "h", config.PeriodDay: "day"}

// WindowText is one window in words: "600k/min burst 20s", "$1000/month", "50 req/min".
func WindowText(amount twv1alpha1.Amount, w config.Window, limit float64) string {
	var n string
	switch amount {
	case twv1alpha1.AmountCost:
		n = "$" + dollars(limit)
	case twv1alpha1.AmountRequests:
		n = Compact(limit) + " req"
	case twv1alpha1.AmountInFlight:
		return Compact(limit) + " in flight"
	default:
		n = Compact(limit)
	}
	if r := w.Rolling; r != nil {
		t := n + "/" + periodUnits[r.Period]
		if r.BurstSeconds > 0 {
			t += " burst " + strconv.FormatFloat(r.BurstSeconds, 'f', -1, 64) + "s"
		}
		return t
	}
	c := w.Calendar
	t := n + "/" + string(c.Every)
	switch {
	case c.Every == config.EveryWeek && c.Weekday != "" && c.Weekday != "monday":
		t += " from " + strings.ToUpper(c.Weekday[:1]) + c.Weekday[1:]
	case c.Every == config.EveryMonth && c.DayOfMonth > 1:
		t += " from day " + strconv.Itoa(c.DayOfMonth)
	}
	if c.At != "" && c.At != "00:00" {
		t += " at " + c.At
	}
	if c.TimeZone != "" && c.TimeZone != "UTC" {
		t += " " + c.TimeZone
	}
	return t
}

// Compact writes a whole number short when that loses nothing: 600k, 2.4M, 1666666.
func Compact(v float64) string {
	n := int64(v)
	for _, u := range []struct {
		size int64
		unit string
	}{{1_000_000_000, "G"}, {1_000_000, "M"}, {1_000, "k"}} {
		if n >= u.size && n%(u.size/100) == 0 {
			return strconv.FormatFloat(float64(n)/float64(u.size), 'f', -1, 64) + u.unit
		}
	}
	return strconv.FormatInt(n, 10)
}

// dollars writes an amount of US dollars: 1000, 25.50, 0.005.
func dollars(v float64) string {
	if v == math.Trunc(v) {
		return strconv.FormatFloat(v, 'f', 0, 64)
	}
	if c := v * 100; math.Abs(c-math.Round(c)) < 1e-9 {
		return strconv.FormatFloat(v, 'f', 2, 64)
	}
	return strconv.FormatFloat(v, 'f', -1, 64)
}

// epochOf is the recorded epoch of a group; "" when none is.
func epochOf(epochs []twv1alpha1.DurableEpoch, group string) string {
	for _, e := range epochs {
		if e.Group == group {
			return e.Epoch
		}
	}
	return ""
}

// ledgerAttestationOf is a group's order to attest its lost counters from the spend
// ledger; nil when none stands.
func ledgerAttestationOf(epochs []twv1alpha1.DurableEpoch, group string) *config.LedgerAttestation {
	for _, e := range epochs {
		if e.Group == group && e.LedgerAttestation != nil {
			return &config.LedgerAttestation{Epoch: e.Epoch, FlushedThroughMillis: e.LedgerAttestation.FlushedThrough.UnixMilli()}
		}
	}
	return nil
}
