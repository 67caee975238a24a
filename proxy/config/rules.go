// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package config

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
)

// Model is one client-facing model: what it costs and, in the model registry
// (models.go), its context window, its largest output and the upstreams that serve it.
type Model struct {
	// Name is the client-facing model name, as requests carry it.
	Name string `json:"name"`
	// Price is what the model costs, for budgets whose amount is cost.
	Price *Price `json:"price,omitempty"`
	// ContextWindow is the model's context window in tokens: input and output share
	// it. A request whose input (at least) plus requested output cannot fit is
	// refused with 400 before any budget or upstream sees it. 0 or absent: not checked.
	ContextWindow int64 `json:"context_window,omitempty"`
	// MaxOutputTokens is the most the model generates in one answer; a request asking
	// for more is refused with 400. 0 or absent: not checked.
	MaxOutputTokens int64 `json:"max_output_tokens,omitempty"`
	// Upstreams are the upstreams that serve the model, in the order they are tried:
	// the first healthy one that is not cooling down serves a request, and an upstream
	// error before the answer began moves it to the next. Absent: the upstream that
	// lists the model in its models, else the catch-all.
	Upstreams []ModelUpstream `json:"upstreams,omitempty"`
	// Tokenizer is the byte-pair encoding that counts the model's input in place of the
	// estimate: o200k_base or cl100k_base (Tokenizers). Absent: the estimate.
	Tokenizer string `json:"tokenizer,omitempty"`
	// AdmissionPolicy is what becomes of a request that asks for more output than
	// the model generates or its window leaves: refuse or clamp (routing.go).
	// Absent: routing.admission_policy.
	AdmissionPolicy AdmissionPolicy `json:"admission_policy,omitempty"`
	// AcceptsLoweredOutputCap declares that the model's providers answer a request
	// whose output cap was lowered as they answer any other (a stop at the cap is
	// finish_reason "length"): only then may clamp lower it.
	AcceptsLoweredOutputCap bool `json:"accepts_lowered_output_cap,omitempty"`
	// UnavailableFallback is the model of models that serves a request of this one
	// when every upstream of this one is unavailable (breakers open, credentials
	// cooling), before any attempt: once, if it fits the substitute's window, has an
	// upstream that may take it, and its budgets admit it. Absent: 503.
	UnavailableFallback string `json:"unavailable_fallback,omitempty"`
}

// Price is a model's price in US dollars per million tokens.
type Price struct {
	// Input is the price of a million input tokens that were not read from a cache.
	Input float64 `json:"input"`
	// Output is the price of a million generated tokens.
	Output float64 `json:"output"`
	// CachedInput is the price of a million input tokens read from the backend's
	// prompt cache. Absent: the input price.
	CachedInput *float64 `json:"cached_input,omitempty"`
}

// CachedInputPrice is the price in force for cached input tokens.
func (p *Price) CachedInputPrice() float64 {
	if p.CachedInput != nil {
		return *p.CachedInput
	}
	return p.Input
}

// Rule is one budget in the general rule shape: what it counts (amount), which
// requests it governs (dimension, subjects, models), what it fans out by (count_by),
// over which windows, and what happens at the limit (action). The `limits`
// and the per-key overrides are rules too, resolved by the proxy; a rule that names
// subjects replaces, for those subjects, the each-subject rule of the same dimension,
// count_by, models, amount, window period and action (a named warn rule never lifts an
// enforced budget) of its own level (the platform's, or one tenant's), and every other
// rule stacks.
type Rule struct {
	// Name identifies the rule in refusals, headers, metrics and the admin endpoint;
	// unique in the document. The operator writes <namespace>/<TokenBudget name>.
	Name string `json:"name"`
	// Dimension is what the rule is counted per: global, client, api_key, user, team
	// or model.
	Dimension RuleDimension `json:"dimension"`
	// Subjects, when set, are the only subjects of the dimension the rule applies to
	// (these teams, these keys); empty applies it to each subject. Not for global.
	Subjects []string `json:"subjects,omitempty"`
	// CountBy fans the rule out by a second attribute (attributes.go): each (subject,
	// value) pair has its own counter, e.g. per key per model or per key per session.
	// Empty: one counter per subject.
	CountBy RuleDimension `json:"count_by,omitempty"`
	// Models, when set, restricts the rule to requests for these client-facing models.
	Models []string `json:"models,omitempty"`
	// AppliesWhen restricts the rule to the requests whose every listed attribute
	// holds one of its values (attributes.go): {endpoint: [chat_completions], agent:
	// [planner]}. Absent: every request.
	AppliesWhen map[RuleDimension][]string `json:"applies_when,omitempty"`
	// Amount is what is counted. Default tokens.
	Amount Amount `json:"amount,omitempty"`
	// Action is what happens at the limit. Default block.
	Action Action `json:"action,omitempty"`
	// Windows are the rule's limits, each over its own window; all of them apply.
	Windows []Window `json:"windows"`
	// Tenant, when set, makes the rule a tenant's: it governs only the requests of the
	// keys of that tenant (api_keys' tenant), it replaces and is replaced only by that
	// tenant's rules, and it is reserved after the platform's rules. Empty: the
	// platform's rule, which governs every request.
	Tenant string `json:"tenant,omitempty"`
	// FallbackModel, on a rule of dimension model, serves a request the rule refuses
	// with this model instead (an entry of models), charged to its budgets, rather
	// than answering 429 (models.go). Absent: the rule refuses.
	FallbackModel string `json:"fallback_model,omitempty"`
}

// RuleDimension is what a rule is counted per.
type RuleDimension string

// Rule dimensions: the six admission-time dimensions, and the tenant a key belongs to.
const (
	RuleGlobal RuleDimension = "global"
	RuleClient RuleDimension = "client"
	RuleAPIKey RuleDimension = "api_key"
	RuleUser   RuleDimension = "user"
	RuleTeam   RuleDimension = "team"
	RuleModel  RuleDimension = "model"
	// RuleTenant counts each tenant's keys together: the platform's cap on a tenant.
	RuleTenant RuleDimension = "tenant"
)

var ruleDimensions = []RuleDimension{RuleGlobal, RuleClient, RuleAPIKey, RuleUser, RuleTeam, RuleModel, RuleTenant}

// Amount is what a rule counts.
type Amount string

// Amounts.
const (
	// AmountTokens counts input plus output tokens, as the limits' token budgets do.
	AmountTokens Amount = "tokens"
	// AmountInputTokens counts input tokens only.
	AmountInputTokens Amount = "input_tokens"
	// AmountOutputTokens counts generated tokens only.
	AmountOutputTokens Amount = "output_tokens"
	// AmountRequests counts requests.
	AmountRequests Amount = "requests"
	// AmountCost counts US dollars, priced from the model's entry in models.
	AmountCost Amount = "cost"
	// AmountInFlight counts the requests in flight now: admitted and not yet ended
	// (answered in full, cut, cancelled, failed). Its one window is a limit without a
	// period; it is never divided among replicas.
	AmountInFlight Amount = "in_flight"
)

var amounts = []Amount{AmountTokens, AmountInputTokens, AmountOutputTokens, AmountRequests, AmountCost, AmountInFlight}

var actions = []Action{ActionBlock, ActionWarn}

// Action is what happens when a request does not fit a rule.
type Action string

// Actions.
const (
	// ActionBlock refuses the request (429).
	ActionBlock Action = "block"
	// ActionWarn admits it, counts the would-be refusal, exports it and reports it in
	// a response header: a budget watched before it is enforced.
	ActionWarn Action = "warn"
)

// Window is one limit of a rule over one window: rolling (a token bucket) or calendar
// (a counter that resets at an anchor). Exactly one of Rolling and Calendar is set.
type Window struct {
	// Limit is the allowance per window in the rule's amount: tokens, requests or US
	// dollars. Tokens and requests are whole numbers. The document may write it as a
	// number or as a quantity string: "25.50", "600k", "1.5M" (UnmarshalJSON).
	Limit float64 `json:"limit"`
	// Rolling is a bucket that refills continuously at limit per period.
	Rolling *Rolling `json:"rolling,omitempty"`
	// Calendar is a counter that starts at zero at each anchor.
	Calendar *Calendar `json:"calendar,omitempty"`
	// badLimit is the limit as written when it is neither a number nor a quantity
	// string; Validate names it.
	badLimit string
}

// Rolling is a token bucket: it refills at limit per period, and holds burst_seconds
// of refill (default one period: the bucket holds one period's allowance).
type Rolling struct {
	// Period is second, minute, hour or day.
	Period Period `json:"period"`
	// BurstSeconds is how many seconds of refill the bucket holds: the burst it
	// absorbs. 0 or absent: one period.
	BurstSeconds float64 `json:"burst_seconds,omitempty"`
}

// Period is a rolling window's length.
type Period string

// Periods.
const (
	PeriodSecond Period = "second"
	PeriodMinute Period = "minute"
	PeriodHour   Period = "hour"
	PeriodDay    Period = "day"
)

var periods = map[Period]time.Duration{PeriodSecond: time.Second, PeriodMinute: time.Minute, PeriodHour: time.Hour, PeriodDay: 24 * time.Hour}

var periodWords = []Period{PeriodSecond, PeriodMinute, PeriodHour, PeriodDay}

// Duration is the period's length; 0 for an unknown period.
func (p Period) Duration() time.Duration { return periods[p] }

// Calendar is a window that starts at zero at an anchor in a time zone: every day at
// a time of day, every week on a day of the week, or every month on a day of the
// month (on a shorter month, its last day). Daylight-saving changes move the instant,
// never the wall-clock anchor.
type Calendar struct {
	// Every is day, week or month.
	Every CalendarUnit `json:"every"`
	// TimeZone is an IANA zone name. Default UTC.
	TimeZone string `json:"time_zone,omitempty"`
	// At is the wall-clock time the window starts, HH:MM. Default 00:00.
	At string `json:"at,omitempty"`
	// Weekday starts a weekly window: monday to sunday. Default monday.
	Weekday string `json:"weekday,omitempty"`
	// DayOfMonth starts a monthly window: 1 to 31 (the month's last day when it is
	// shorter). Default 1.
	DayOfMonth int `json:"day_of_month,omitempty"`
}

// CalendarUnit is how often a calendar window starts.
type CalendarUnit string

// Calendar units.
const (
	EveryDay   CalendarUnit = "day"
	EveryWeek  CalendarUnit = "week"
	EveryMonth CalendarUnit = "month"
)

var calendarUnits = []CalendarUnit{EveryDay, EveryWeek, EveryMonth}

var weekdays = []string{"sunday", "monday", "tuesday", "wednesday", "thursday", "friday", "saturday"}

// WeekdayValue is the weekday a weekly window starts on (default monday).
func (c *Calendar) WeekdayValue() time.Weekday {
	if c.Weekday == "" {
		return time.Monday
	}
	return time.Weekday(slices.Index(weekdays, c.Weekday))
}

// zones caches the loaded time zones by name: time.LoadLocation reads and parses the
// zone database on every call, and Span runs on every request of a calendar rule.
var zones sync.Map // string -> *time.Location

// Location loads the calendar's time zone.
func (c *Calendar) Location() (*time.Location, error) {
	if c.TimeZone == "" {
		return time.UTC, nil
	}
	if loc, ok := zones.Load(c.TimeZone); ok {
		return loc.(*time.Location), nil
	}
	loc, err := time.LoadLocation(c.TimeZone)
	if err != nil {
		return nil, err
	}
	zones.Store(c.TimeZone, loc)
	return loc, nil
}

// Durable reports whether the rule must not lose its state: a calendar window or a
// cost amount. Such a rule needs storage: redis and never fails open.
func (r *Rule) Durable() bool {
	return r.Amount == AmountCost || slices.ContainsFunc(r.Windows, func(w Window) bool { return w.Calendar != nil })
}

var (
	ruleNameRE = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9._/-]{0,251}[A-Za-z0-9])?$`)
	atRE       = regexp.MustCompile(`^([01][0-9]|2[0-3]):[0-5][0-9]$`)
	// tenantNameRE is a namespace's name: a DNS label.
	tenantNameRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)
)

// defaultRules fills in each rule's defaults, and spells each closed word the way
// the proxy does (canonicalWord).
func (rl *RateLimiting) defaultRules() {
	for i := range rl.Rules {
		r := &rl.Rules[i]
		if r.Amount == "" {
			r.Amount = AmountTokens
		}
		if r.Action == "" {
			r.Action = ActionBlock
		}
		r.Dimension = canonicalDimension(r.Dimension)
		if r.CountBy != "" {
			r.CountBy = canonicalAttribute(r.CountBy)
		}
		r.defaultSelector()
		r.Amount = canonicalWord(r.Amount, amounts)
		r.Action = canonicalWord(r.Action, actions)
		for j := range r.Windows {
			if w := r.Windows[j].Rolling; w != nil {
				w.Period = canonicalWord(w.Period, periodWords)
			}
			if c := r.Windows[j].Calendar; c != nil {
				c.Every = canonicalWord(c.Every, calendarUnits)
				if c.Weekday != "" {
					c.Weekday = canonicalWord(c.Weekday, weekdays)
				}
			}
		}
	}
}

// canonicalWord is the word of allowed that w spells whatever its case and
// underscores, as the TokenBudget writes them ("Minute", "Friday", "InputTokens" for
// minute, friday, input_tokens); w itself when it spells none, for Validate to name.
func canonicalWord[T ~string](w T, allowed []T) T {
	folded := foldWord(string(w))
	for _, a := range allowed {
		if foldWord(string(a)) == folded {
			return a
		}
	}
	return w
}

// canonicalDimension is canonicalWord for a rule dimension, which also takes the
// TokenBudget's dimension words ("PerTeam", "PerAPIKey").
func canonicalDimension(d RuleDimension) RuleDimension {
	if c := canonicalWord(d, ruleDimensions); slices.Contains(ruleDimensions, c) {
		return c
	}
	if f := foldWord(string(d)); strings.HasPrefix(f, "per") {
		if c := canonicalWord(RuleDimension(f[3:]), ruleDimensions); slices.Contains(ruleDimensions, c) {
			return c
		}
	}
	return d
}

// foldWord is a word in lower case without underscores.
func foldWord(s string) string { return strings.ToLower(strings.ReplaceAll(s, "_", "")) }

// UnmarshalJSON reads a window whose limit is a number or a quantity string, as a
// TokenBudget writes it: "25.50", "600k", "1.5M" (a Kubernetes quantity: decimal
// suffixes k, M, G, T, P, E; binary Ki, Mi, ...). A limit that is neither is kept for
// Validate, which names its field. Unknown fields are refused, as everywhere in the
// document.
func (w *Window) UnmarshalJSON(data []byte) error {
	type plain Window
	var in struct {
		plain
		Limit json.RawMessage `json:"limit"`
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&in); err != nil {
		return err
	}
	*w = Window(in.plain)
	w.Limit, w.badLimit = 0, ""
	if len(in.Limit) == 0 {
		return nil
	}
	var n float64
	if err := json.Unmarshal(in.Limit, &n); err == nil {
		w.Limit = n
		return nil
	}
	var s string
	if err := json.Unmarshal(in.Limit, &s); err != nil {
		w.badLimit = string(in.Limit)
		return nil
	}
	if n, ok := parseQuantity(s); ok {
		w.Limit = n
		return nil
	}
	w.badLimit = strconv.Quote(s)
	return nil
}

// parseQuantity reads a quantity string as the nearest float64, as the operator
// reads a TokenBudget's limit: "25.50" is 25.5, "600k" 600000.
func parseQuantity(s string) (float64, bool) {
	q, err := resource.ParseQuantity(strings.TrimSpace(s))
	if err != nil {
		return 0, false
	}
	f, err := strconv.ParseFloat(q.AsDec().String(), 64)
	if err != nil {
		return q.AsApproximateFloat64(), true
	}
	return f, true
}

func oneOf[T ~string](errs *fieldErrors, field string, v T, allowed []T) bool {
	if slices.Contains(allowed, v) {
		return true
	}
	words := make([]string, len(allowed))
	for i, a := range allowed {
		words[i] = string(a)
	}
	errs.add(field, "unknown word %q: must be one of %s", v, strings.Join(words, ", "))
	return false
}

func (c *Config) validateModels(errs *fieldErrors) {
	seen := map[string]int{}
	for i, m := range c.Models {
		f := fmt.Sprintf("models[%d]", i)
		if m.Name == "" {
			errs.add(f+".name", "must not be empty")
		} else if j, dup := seen[m.Name]; dup {
			errs.add(f+".name", "%q is also the name of models[%d]", m.Name, j)
		}
		seen[m.Name] = i
		if p := m.Price; p != nil {
			price(errs, f+".price.input", p.Input)
			price(errs, f+".price.output", p.Output)
			if p.CachedInput != nil {
				price(errs, f+".price.cached_input", *p.CachedInput)
			}
		}
	}
}

func price(errs *fieldErrors, field string, v float64) {
	if !(v >= 0) || math.IsInf(v, 0) {
		errs.add(field, "must be a price of 0 or more US dollars per million tokens, got %v", v)
	}
}

func (c *Config) validateRules(errs *fieldErrors) {
	rl := &c.RateLimiting
	if w := rl.CachedInputWeight; w != nil && !(*w >= 0 && *w <= 1) {
		errs.add("rate_limiting.cached_input_weight", "must be from 0 to 1, got %v", *w)
	}
	names := map[string]int{}
	priced := map[string]bool{}
	for _, m := range c.Models {
		priced[m.Name] = m.Price != nil
	}
	for i := range rl.Rules {
		r := &rl.Rules[i]
		f := fmt.Sprintf("rate_limiting.rules[%d]", i)
		if !ruleNameRE.MatchString(r.Name) {
			errs.add(f+".name", "must be a non-empty name of letters, digits, '.', '_', '/' and '-', got %q", r.Name)
		} else if j, dup := names[r.Name]; dup {
			errs.add(f+".name", "%q is also the name of rate_limiting.rules[%d]", r.Name, j)
		}
		names[r.Name] = i
		oneOf(errs, f+".dimension", r.Dimension, ruleDimensions)
		if r.Tenant != "" {
			if !tenantNameRE.MatchString(r.Tenant) {
				errs.add(f+".tenant", "must be a tenant's name of lowercase letters, digits and '-', got %q", r.Tenant)
			}
			if r.Dimension == RuleTenant || r.CountBy == RuleTenant || r.AppliesWhen[RuleTenant] != nil {
				errs.add(f+".tenant", "a tenant's rule counts only its own tenant: dimension, count_by and applies_when tenant are the platform's")
			}
		}
		if r.Dimension == RuleGlobal && len(r.Subjects) > 0 {
			errs.add(f+".subjects", "a global rule has no subjects")
		}
		for j, s := range r.Subjects {
			if s == "" {
				errs.add(fmt.Sprintf("%s.subjects[%d]", f, j), "must not be empty")
			}
		}
		if r.CountBy != "" && oneOf(errs, f+".count_by", r.CountBy, ruleAttributes) && r.CountBy == r.Dimension {
			errs.add(f+".count_by", "is the rule's own dimension %q", r.Dimension)
		}
		r.validateSelector(errs, f)
		for j, m := range r.Models {
			if m == "" {
				errs.add(fmt.Sprintf("%s.models[%d]", f, j), "must not be empty")
			}
		}
		amountKnown := oneOf(errs, f+".amount", r.Amount, amounts)
		oneOf(errs, f+".action", r.Action, actions)
		if r.Amount == AmountCost {
			c.checkPriced(errs, f, r, priced)
		}
		if r.Durable() && rl.Storage != StorageRedis {
			errs.add(f, "a calendar window or a cost amount needs rate_limiting.storage: redis: it must never reset to full because a replica restarted, and in this version Redis is its only durable home")
		}
		switch {
		case len(r.Windows) == 0:
			errs.add(f+".windows", "at least one window is required")
		case r.Amount == AmountInFlight && len(r.Windows) != 1:
			errs.add(f+".windows", "an in_flight rule has one window, its limit: what is in flight is counted now, not over a period")
		}
		if r.Amount == AmountInFlight && r.Action == ActionWarn {
			errs.add(f+".action", "an in_flight rule blocks: a watched limit in flight is not supported")
		}
		for j := range r.Windows {
			validateWindow(errs, fmt.Sprintf("%s.windows[%d]", f, j), r, amountKnown, &r.Windows[j])
		}
	}
}

// checkPriced refuses a cost rule that could meet a model without a price.
func (c *Config) checkPriced(errs *fieldErrors, f string, r *Rule, priced map[string]bool) {
	models := r.Models
	if len(models) == 0 && r.Dimension == RuleModel {
		models = r.Subjects
	}
	if len(models) == 0 {
		for _, m := range c.Models {
			if m.Price == nil {
				errs.add(f+".amount", "cost needs a price for every model the rule governs: models[%q] has none (set rules' models to the priced ones, or price it)", m.Name)
			}
		}
		if len(c.Models) == 0 {
			errs.add(f+".amount", "cost needs prices: add the models the rule governs, with their prices, to models")
		}
		return
	}
	for _, m := range models {
		if !priced[m] {
			errs.add(f+".amount", "cost needs a price for model %q: add it with a price to models", m)
		}
	}
}

func validateWindow(errs *fieldErrors, f string, r *Rule, amountKnown bool, w *Window) {
	switch {
	case w.badLimit != "":
		errs.add(f+".limit", "must be a number or a quantity string such as \"25.50\" or \"600k\", got %s", w.badLimit)
	case !(w.Limit > 0) || math.IsInf(w.Limit, 0):
		errs.add(f+".limit", "must be above 0, got %v", w.Limit)
	case amountKnown && r.Amount != AmountCost && w.Limit != math.Trunc(w.Limit):
		errs.add(f+".limit", "%s are counted in whole numbers, got %v", r.Amount, w.Limit)
	case w.Limit > 1<<53:
		errs.add(f+".limit", "must be at most 2^53, got %v", w.Limit)
	}
	switch {
	case r.Amount == AmountInFlight:
		if w.Rolling != nil || w.Calendar != nil {
			errs.add(f, "an in_flight window is its limit alone: no rolling or calendar period (what is in flight is counted now)")
		}
	case (w.Rolling == nil) == (w.Calendar == nil):
		errs.add(f, "set exactly one of rolling and calendar")
	case w.Rolling != nil:
		if oneOf(errs, f+".rolling.period", w.Rolling.Period, periodWords) {
			if b := w.Rolling.BurstSeconds; !(b >= 0) || b > 31*24*3600 {
				errs.add(f+".rolling.burst_seconds", "must be from 0 (one period) to 2678400 seconds, got %v", b)
			}
		}
	case w.Calendar != nil:
		cal := w.Calendar
		oneOf(errs, f+".calendar.every", cal.Every, calendarUnits)
		if _, err := cal.Location(); err != nil {
			errs.add(f+".calendar.time_zone", "not an IANA time zone: %q", cal.TimeZone)
		}
		if cal.At != "" && !atRE.MatchString(cal.At) {
			errs.add(f+".calendar.at", "must be a time of day HH:MM, got %q", cal.At)
		}
		if cal.Weekday != "" {
			if cal.Every != EveryWeek {
				errs.add(f+".calendar.weekday", "applies only to every: week")
			} else {
				oneOf(errs, f+".calendar.weekday", cal.Weekday, weekdays)
			}
		}
		if cal.DayOfMonth != 0 {
			if cal.Every != EveryMonth {
				errs.add(f+".calendar.day_of_month", "applies only to every: month")
			} else if cal.DayOfMonth < 1 || cal.DayOfMonth > 31 {
				errs.add(f+".calendar.day_of_month", "must be from 1 to 31, got %d", cal.DayOfMonth)
			}
		}
	}
}

// Span is the calendar window that holds t: it started at start and the next one
// starts at end. Both are wall-clock anchors in the window's zone, so a day is 23 or 25
// hours across a daylight-saving change and a month is as long as the month. The zone
// must be valid (Validate checked it).
func (c *Calendar) Span(t time.Time) (start, end time.Time) {
	loc, err := c.Location()
	if err != nil {
		loc = time.UTC
	}
	hh, mm := 0, 0
	if at := c.At; len(at) == 5 && at[2] == ':' {
		// HH:MM, as Validate checked: read by hand, since a calendar rule spans on
		// every request it governs.
		hh = int(at[0]-'0')*10 + int(at[1]-'0')
		mm = int(at[3]-'0')*10 + int(at[4]-'0')
	}
	lt := t.In(loc)
	y, mo, d := lt.Date()
	at := func(y int, mo time.Month, d int) time.Time { return time.Date(y, mo, d, hh, mm, 0, 0, loc) }
	switch c.Every {
	case EveryWeek:
		back := (int(lt.Weekday()) - int(c.WeekdayValue()) + 7) % 7
		start = at(y, mo, d-back)
		if start.After(t) {
			start = at(y, mo, d-back-7)
		}
		sy, smo, sd := start.Date()
		return start, at(sy, smo, sd+7)
	case EveryMonth:
		dom := c.DayOfMonth
		if dom == 0 {
			dom = 1
		}
		monthAt := func(y int, mo time.Month) time.Time {
			return at(y, mo, min(dom, daysIn(y, mo)))
		}
		start = monthAt(y, mo)
		if start.After(t) {
			start = monthAt(y, mo-1)
		}
		sy, smo, _ := start.Date()
		return start, monthAt(sy, smo+1)
	default:
		start = at(y, mo, d)
		if start.After(t) {
			start = at(y, mo, d-1)
		}
		sy, smo, sd := start.Date()
		return start, at(sy, smo, sd+1)
	}
}

// daysIn is the number of days of a month; mo may be out of range (it normalizes).
func daysIn(y int, mo time.Month) int {
	return time.Date(y, mo+1, 0, 0, 0, 0, 0, time.UTC).Day()
}
