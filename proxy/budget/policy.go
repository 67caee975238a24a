// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package budget

import (
	"cmp"
	"fmt"
	"maps"
	"math"
	"slices"
	"sync/atomic"
	"time"

	"github.com/tokenwarden/tokenwarden/proxy/config"
)

// Policy is one config's limits and rules, resolved: every limit and rule compiled
// into the counters a request may draw on (counter), every rolling allowance divided
// by the replica count, every per-key override and named-subject rule applied. It is
// immutable; a reload builds a new one.
type Policy struct {
	// Divisor is the budget division in force.
	Divisor int64
	// overage is what settlement does with an overage a bucket cannot cover.
	overage Overage
	// cachedWeight is what a cached input token counts in tokens and input_tokens.
	cachedWeight float64
	// platform is the counters of the platform's level: the limits and the rules
	// without a tenant, which every request is checked against; tenants are each
	// tenant's rules, which only its keys' requests are (KeyPolicy.level).
	platform level
	tenants  map[string]*level
	// skipTokens: the dimension has a platform counter beyond requests, so a request
	// without the dimension's identity is counted as skipped (rate_limit_skipped_total).
	skipTokens [NumDimensions]bool
	// prices are the models' prices; maxPrice prices a model that has none.
	prices   map[string]*config.Price
	maxPrice config.Price
	// rules are the rule counters by name and window, for Keeps; order is each
	// rule's place in the document.
	rules map[ruleWindow]*counter
	order map[string]int

	// reads are the attributes beyond the dimensions its rules use; maxValues bounds
	// each client-supplied count_by's distinct values per key and window.
	reads     Attrs
	maxValues int64

	dims   [Model]dimPolicy
	models map[string]*dimPolicy
	keys   map[string]*KeyPolicy // by name
	// replaced are, by key name, those of a key's limits that a named api_key rule
	// replaces (for Explain): few keys have any, and a large fleet has 50,000.
	replaced map[string][]*counter
}

// level is the counters of one level of the tenancy tree, checked per request: the
// platform's (the limits' buckets, then the rules in document order) or one tenant's
// (its rules). api_key has none here: each key holds its own (KeyPolicy.counters and
// tenantCounters). model holds its each-subject rules here and its named ones
// (per_model, rules with subjects) in byModel.
type level struct {
	counters [NumDimensions][]*counter
	byModel  map[string][]*counter
}

// levelOf is the level of a tenant ("": the platform's), made on first use.
func (p *Policy) levelOf(tenant string) *level {
	if tenant == "" {
		return &p.platform
	}
	lv := p.tenants[tenant]
	if lv == nil {
		lv = &level{byModel: map[string][]*counter{}}
		p.tenants[tenant] = lv
	}
	return lv
}

type ruleWindow struct {
	rule   string
	window uint8
}

// Amount is what a counter counts.
type Amount uint8

// Amounts, as rules name them.
const (
	// AmountTokens is input plus output tokens, as limits count them.
	AmountTokens Amount = iota
	AmountInput
	AmountOutput
	AmountRequests
	// AmountCost is US dollars.
	AmountCost
	// AmountInFlight is the requests in flight now: a slot taken at admission and
	// given back when the request ends (slots.go).
	AmountInFlight
	NumAmounts
)

var amountNames = [NumAmounts]string{"tokens", "input_tokens", "output_tokens", "requests", "cost", "in_flight"}

// String is the amount as rules name it.
func (a Amount) String() string {
	if a < NumAmounts {
		return amountNames[a]
	}
	return "unknown"
}

var configAmounts = map[config.Amount]Amount{
	config.AmountTokens: AmountTokens, config.AmountInputTokens: AmountInput, config.AmountOutputTokens: AmountOutput,
	config.AmountRequests: AmountRequests, config.AmountCost: AmountCost, config.AmountInFlight: AmountInFlight,
}

var configDims = map[config.RuleDimension]Dimension{
	config.RuleGlobal: Global, config.RuleClient: Client, config.RuleAPIKey: APIKey,
	config.RuleUser: User, config.RuleTeam: Team, config.RuleModel: Model, config.RuleTenant: Tenant,
}

type set map[string]struct{}

func setOf(names []string) set {
	if len(names) == 0 {
		return nil
	}
	s := make(set, len(names))
	for _, n := range names {
		s[n] = struct{}{}
	}
	return s
}

func (s set) has(n string) bool {
	_, ok := s[n]
	return ok
}

// counter is one compiled budget: which requests it governs, what it counts, over
// which window, with what allowance, and what happens at its limit. A request draws
// on one bucket of it: the one of its subject (and count_by value).
type counter struct {
	// rule is the rule's name; empty for limits and the per-key overrides.
	rule string
	// tenant is the tenant whose rule it is; empty for the platform's.
	tenant string
	// window is the window's index in the rule; name is how refusals, headers and
	// metrics name it: a rolling period (second, minute, hour, day) or
	// calendar_day, calendar_week, calendar_month.
	window uint8
	name   string
	dim    Dimension
	kind   Kind
	amount Amount
	// countBy fans the counter out by a second attribute; NumAttrs: none.
	countBy Attr
	// when are its applies_when selectors beyond models; nil: none.
	when []selector
	// subjects, when set, are the only subjects it applies to; excluded are the
	// subjects a named-subject counter replaces it for.
	subjects, excluded set
	// models, when set, are the only models it applies to.
	models set
	warn   bool
	// durable: a calendar window or a cost amount, never failing open.
	durable bool
	// both: a limits token bucket whose dimension has a minute and a day budget.
	both bool
	// scoped: the counter is the caller's own (api_key, or counted by api_key), so a
	// refusal may name it and headers may report it.
	scoped bool
	// capacity and rate are this replica's (divided) share; sharedCapacity and
	// sharedRate the fleet totals a shared store holds.
	capacity, rate             float64
	sharedCapacity, sharedRate float64
	period                     time.Duration
	calendar                   *config.Calendar
	// group identifies what a named-subject counter replaces: the each-subject
	// counter of the same level, dimension, count_by, models, amount, window period
	// and action.
	group string
	// stats are the counter's metrics, resolved at first use; span is a calendar
	// window's last window.
	stats *atomic.Pointer[ruleStats]
	span  *atomic.Pointer[span]
}

type ruleStats struct{ r RuleRecorder }

func (c *counter) groupKey() string {
	ms := make([]string, 0, len(c.models))
	for m := range c.models {
		ms = append(ms, m)
	}
	slices.Sort(ms)
	// The action is part of the group: a named warn rule never lifts an enforced
	// budget, and a named block rule never replaces a watched one.
	// So is the level: a tenant's named rule never replaces the platform's budget,
	// nor another tenant's.
	return fmt.Sprintf("%q|%d|%d|%q|%d|%s|%v|%s", c.tenant, c.dim, c.countBy, ms, c.amount, c.name, c.warn, c.whenKey())
}

// limitCounters compiles one dimension's limits: the request bucket, then the minute
// and day token buckets.
func limitCounters(dim Dimension, rps, burst, tpm, tpd, div int64) []*counter {
	var out []*counter
	base := counter{dim: dim, countBy: NumAttrs, scoped: dim == APIKey, both: tpm > 0 && tpd > 0}
	if rate, capacity := requestBucket(rps, burst); rate > 0 {
		c := base
		c.kind, c.amount, c.name, c.period = Requests, AmountRequests, "second", time.Second
		c.capacity, c.rate, c.sharedCapacity, c.sharedRate = capacity, rate, capacity, rate
		out = append(out, &c)
	}
	for _, t := range []struct {
		kind  Kind
		total int64
	}{{TokensMinute, tpm}, {TokensDay, tpd}} {
		a := Divide(t.total, div)
		if !a.Limited() {
			continue
		}
		c := base
		c.kind, c.amount, c.name, c.period = t.kind, AmountTokens, t.kind.String(), t.kind.Period()
		ch := tokenCharge(t.kind, dim, "", a)
		c.capacity, c.rate, c.sharedCapacity, c.sharedRate = ch.Capacity, ch.Rate, ch.SharedCapacity, ch.SharedRate
		out = append(out, &c)
	}
	for _, c := range out {
		c.group = c.groupKey()
	}
	return out
}

// ruleCounters compiles one rule: a counter per window.
func ruleCounters(r *config.Rule, div int64) []*counter {
	var out []*counter
	for i, w := range r.Windows {
		c := &counter{
			rule: r.Name, tenant: r.Tenant, window: uint8(i), dim: configDims[r.Dimension], countBy: NumAttrs,
			amount: configAmounts[r.Amount], subjects: setOf(r.Subjects), models: setOf(r.Models),
			warn: r.Action == config.ActionWarn, durable: r.Durable(), when: selectorsOf(r),
		}
		if ms := r.AppliesWhen[config.RuleModel]; len(ms) > 0 {
			c.models = setOf(ms)
		}
		if r.CountBy != "" {
			c.countBy = configAttrs[r.CountBy]
		}
		c.scoped = c.dim == APIKey || c.countBy == AttrAPIKey
		switch {
		case c.amount == AmountInFlight:
			// Never divided: a limit of 2 among 3 replicas would be 0. The period bounds
			// its client-supplied values per minute.
			c.kind, c.name, c.period = InFlight, "in_flight", time.Minute
			c.capacity, c.sharedCapacity = w.Limit, w.Limit
		case w.Rolling != nil:
			c.kind, c.name, c.period = Rolling, string(w.Rolling.Period), w.Rolling.Period.Duration()
			secs := c.period.Seconds()
			burst := w.Rolling.BurstSeconds
			if burst <= 0 {
				burst = secs
			}
			// Every number written is a fleet total: a replica's memory holds its share,
			// whole numbers floored as limits' are.
			share := w.Limit / float64(max(div, 1))
			if c.amount != AmountCost {
				share = math.Floor(share)
			}
			c.rate, c.sharedRate = share/secs, w.Limit/secs
			c.capacity, c.sharedCapacity = share*burst/secs, w.Limit*burst/secs
		case w.Calendar != nil:
			// A calendar counter lives only in a shared store, whole: it is a fleet total.
			c.kind, c.name, c.calendar = Calendar, "calendar_"+string(w.Calendar.Every), w.Calendar
			c.capacity, c.sharedCapacity = w.Limit, w.Limit
			c.period = 24 * time.Hour
		}
		c.group = c.groupKey()
		c.stats, c.span = new(atomic.Pointer[ruleStats]), new(atomic.Pointer[span])
		out = append(out, c)
	}
	return out
}

// requestBucket resolves a request rate and burst: the burst defaults to one second of
// the rate, and a burst smaller than that is accepted (it still admits the rate).
func requestBucket(rps, burst int64) (rate, capacity float64) {
	if rps <= 0 {
		return 0, 0
	}
	if burst <= 0 {
		burst = rps
	}
	return float64(rps), float64(burst)
}

// dimPolicy is one dimension's limits as configured and divided, for Keeps and
// Effective.
type dimPolicy struct {
	limits       config.DimensionLimits // as configured: the fleet totals
	minute, day  Allowance
	reqRate      float64
	reqBurst     float64
	configured   bool
	requestLimit bool
}

func newDimPolicy(l config.DimensionLimits, divisor int64) dimPolicy {
	p := dimPolicy{
		limits: l,
		minute: Divide(l.TokensPerMinute, divisor),
		day:    Divide(l.TokensPerDay, divisor),
	}
	p.reqRate, p.reqBurst = requestBucket(l.RequestsPerSecond, l.BurstCapacity)
	p.requestLimit = p.reqRate > 0
	p.configured = p.minute.Limited() || p.day.Limited() || p.requestLimit
	return p
}

// KeyPolicy is one API key: its identity and its resolved api_key budgets (the
// dimension's limits with the key's overrides applied, and the api_key rules that
// apply to it).
type KeyPolicy struct {
	Name string
	User string
	Team string
	// Tenant is the tenant the key belongs to; empty for the platform's own keys.
	Tenant string
	// Environment is the key's environment, as the platform set it.
	Environment string
	// minute and day are the key's allowances: its divided overrides when set,
	// otherwise per_api_key's (each holds the fleet total it comes from).
	minute, day Allowance
	reqRate     float64
	reqBurst    float64
	// counters are the key's api_key counters of the platform's level; tenantCounters
	// those of its tenant's, whose other counters are level (nil: its tenant has none).
	counters       []*counter
	tenantCounters []*counter
	level          *level
	// overrides are the key's own values that replace per_api_key's: requests, then
	// the minute and day tokens (for Explain).
	overrides [3]bool
	Bypass    bool
}

// NewPolicy resolves a validated config's limits and rules.
func NewPolicy(c *config.Config) *Policy {
	div := c.Divisor()
	rl := &c.RateLimiting
	l := &rl.Limits
	p := &Policy{
		Divisor: div, cachedWeight: rl.CachedWeight(), maxValues: cmp.Or(rl.MaxAttributeValues, config.DefaultMaxAttributeValues),
		models: map[string]*dimPolicy{}, keys: make(map[string]*KeyPolicy, len(c.APIKeys)), tenants: map[string]*level{},
		platform: level{byModel: map[string][]*counter{}},
		prices:   map[string]*config.Price{}, rules: map[ruleWindow]*counter{}, order: map[string]int{},
	}
	if rl.Overage == config.OverageForgive {
		p.overage = Forgive
	}
	for i := range c.Models {
		if pr := c.Models[i].Price; pr != nil {
			p.prices[c.Models[i].Name] = pr
			p.maxPrice.Input = max(p.maxPrice.Input, pr.Input, pr.CachedInputPrice())
			p.maxPrice.Output = max(p.maxPrice.Output, pr.Output)
		}
	}
	dimLimits := [Model]config.DimensionLimits{l.Global, l.PerClient, l.PerAPIKey, l.PerUser, l.PerTeam}
	for d := Global; d < Model; d++ {
		p.dims[d] = newDimPolicy(dimLimits[d], div)
		if d != APIKey {
			dl := dimLimits[d]
			p.platform.counters[d] = limitCounters(d, dl.RequestsPerSecond, dl.BurstCapacity, dl.TokensPerMinute, dl.TokensPerDay, div)
		}
		p.skipTokens[d] = p.dims[d].minute.Limited() || p.dims[d].day.Limited()
	}
	for _, m := range slices.Sorted(maps.Keys(l.PerModel)) {
		ml := l.PerModel[m]
		dp := newDimPolicy(ml, div)
		p.models[m] = &dp
		p.platform.byModel[m] = limitCounters(Model, ml.RequestsPerSecond, ml.BurstCapacity, ml.TokensPerMinute, ml.TokensPerDay, div)
	}
	p.skipTokens[Model] = len(l.PerModel) > 0

	// Rules, and what each named-subject counter replaces (within its level: the
	// group holds the tenant). The api_key counters are by tenant ("": the platform's).
	var named []*counter
	apiKeyEach, apiKeyNamed := map[string][]*counter{}, map[string][]*counter{}
	replaced := map[string]set{}
	for i := range rl.Rules {
		r := &rl.Rules[i]
		p.order[r.Name] = i
		lv := p.levelOf(r.Tenant)
		p.reads |= readsOf(r)
		for _, ctr := range ruleCounters(r, div) {
			p.rules[ruleWindow{ctr.rule, ctr.window}] = ctr
			if ctr.amount != AmountRequests && ctr.amount != AmountInFlight && ctr.tenant == "" {
				p.skipTokens[ctr.dim] = true
			}
			switch {
			case ctr.subjects != nil:
				named = append(named, ctr)
				if replaced[ctr.group] == nil {
					replaced[ctr.group] = set{}
				}
				for s := range ctr.subjects {
					replaced[ctr.group][s] = struct{}{}
				}
			case ctr.dim == APIKey:
				apiKeyEach[ctr.tenant] = append(apiKeyEach[ctr.tenant], ctr)
			default:
				lv.counters[ctr.dim] = append(lv.counters[ctr.dim], ctr)
			}
		}
	}
	for _, lv := range append([]*level{&p.platform}, slices.Collect(maps.Values(p.tenants))...) {
		for d := range lv.counters {
			for _, ctr := range lv.counters[d] {
				ctr.excluded = replaced[ctr.group]
			}
		}
	}
	for _, list := range apiKeyEach {
		for _, ctr := range list {
			ctr.excluded = replaced[ctr.group]
		}
	}
	for _, ctr := range named {
		lv := p.levelOf(ctr.tenant)
		switch ctr.dim {
		case Model:
			for m := range ctr.subjects {
				lv.byModel[m] = append(lv.byModel[m], ctr)
			}
		case APIKey:
			apiKeyNamed[ctr.tenant] = append(apiKeyNamed[ctr.tenant], ctr)
		default:
			lv.counters[ctr.dim] = append(lv.counters[ctr.dim], ctr)
		}
	}
	for _, k := range c.APIKeys {
		kp := p.newKeyPolicy(k, div)
		// A named api_key rule replaces the key's limit of the same amount and period.
		for _, x := range kp.counters {
			if replaced[x.group].has(k.Name) {
				if p.replaced == nil {
					p.replaced = map[string][]*counter{}
				}
				p.replaced[k.Name] = append(p.replaced[k.Name], x)
			}
		}
		kp.counters = slices.DeleteFunc(kp.counters, func(x *counter) bool { return replaced[x.group].has(k.Name) })
		kp.counters = keyCounters(kp.counters, k.Name, apiKeyEach[""], apiKeyNamed[""])
		if k.Tenant != "" {
			kp.tenantCounters = keyCounters(nil, k.Name, apiKeyEach[k.Tenant], apiKeyNamed[k.Tenant])
			kp.level = p.tenants[k.Tenant]
		}
		p.keys[k.Name] = kp
	}
	return p
}

// keyCounters appends to list the api_key counters of one level that apply to a key:
// the each-key ones no named one replaces for it, and the named ones that name it.
func keyCounters(list []*counter, key string, each, named []*counter) []*counter {
	for _, ctr := range each {
		if !ctr.excluded.has(key) {
			list = append(list, ctr)
		}
	}
	for _, ctr := range named {
		if ctr.subjects.has(key) {
			list = append(list, ctr)
		}
	}
	return list
}

func (p *Policy) newKeyPolicy(k config.APIKey, div int64) *KeyPolicy {
	d := &p.dims[APIKey]
	kp := &KeyPolicy{Name: k.Name, User: k.User, Team: k.Team, Tenant: k.Tenant, Environment: k.Environment, Bypass: k.Bypass, minute: d.minute, day: d.day}
	tpm, tpd := d.limits.TokensPerMinute, d.limits.TokensPerDay
	if k.RateLimitTokensPerMinute > 0 {
		// Every number written on a resource is a fleet total: the override is divided too.
		tpm = k.RateLimitTokensPerMinute
		kp.minute, kp.overrides[1] = Divide(tpm, div), true
	}
	if k.RateLimitTokensPerDay > 0 {
		tpd = k.RateLimitTokensPerDay
		kp.day, kp.overrides[2] = Divide(tpd, div), true
	}
	rps := d.limits.RequestsPerSecond
	if k.RateLimit > 0 {
		rps, kp.overrides[0] = k.RateLimit, true
	}
	burst := d.limits.BurstCapacity
	if k.RateLimitBurst > 0 {
		burst, kp.overrides[0] = k.RateLimitBurst, true
	}
	kp.reqRate, kp.reqBurst = requestBucket(rps, burst)
	kp.counters = limitCounters(APIKey, rps, burst, tpm, tpd, div)
	return kp
}

// price is a model's price; a model without one is priced at the highest prices of
// the table, so that a model missing from it is never free.
func (p *Policy) price(model string) *config.Price {
	if pr := p.prices[model]; pr != nil {
		return pr
	}
	return &p.maxPrice
}

// EffectiveRule describes one rule window in force, for /admin/effective.
type EffectiveRule struct {
	Rule      string   `json:"rule"`
	Tenant    string   `json:"tenant,omitempty"`
	Window    string   `json:"window"`
	Dimension string   `json:"dimension"`
	Subjects  []string `json:"subjects,omitempty"`
	CountBy   string   `json:"count_by,omitempty"`
	Models    []string `json:"models,omitempty"`
	Amount    string   `json:"amount"`
	Warn      bool     `json:"warn,omitempty"`
	// Capacity and Rate are what this replica's memory enforces (the divided share):
	// the bucket's size and its refill per second (0 for a calendar window);
	// SharedCapacity is the fleet total a shared store holds.
	Capacity       float64 `json:"capacity"`
	Rate           float64 `json:"rate_per_second"`
	SharedCapacity float64 `json:"shared_capacity"`
}

// EffectiveRules lists every rule window, in document order.
func (p *Policy) EffectiveRules() []EffectiveRule {
	ctrs := slices.SortedFunc(maps.Values(p.rules), func(a, b *counter) int {
		return cmp.Or(cmp.Compare(p.order[a.rule], p.order[b.rule]), cmp.Compare(a.window, b.window))
	})
	out := make([]EffectiveRule, 0, len(ctrs))
	for _, c := range ctrs {
		e := EffectiveRule{
			Rule: c.rule, Tenant: c.tenant, Window: c.name, Dimension: c.dim.String(), Amount: c.amount.String(), Warn: c.warn,
			Subjects: slices.Sorted(maps.Keys(c.subjects)), Models: slices.Sorted(maps.Keys(c.models)),
			Capacity: c.capacity, Rate: c.rate, SharedCapacity: c.sharedCapacity,
		}
		if c.countBy != NumAttrs {
			e.CountBy = c.countBy.String()
		}
		out = append(out, e)
	}
	return out
}

// HasRule reports whether a rule of this name is in force.
func (p *Policy) HasRule(name string) bool { return p.rules[ruleWindow{name, 0}] != nil }

// Cost is what usage of a model costs in US dollars at its price (cached input at the
// cached_input price); false for a model without a price.
func (p *Policy) Cost(model string, u Used) (float64, bool) {
	pr := p.prices[model]
	if pr == nil {
		return 0, false
	}
	return dollars(pr, u), true
}

func dollars(pr *config.Price, u Used) float64 {
	cached := float64(min(max(u.Cached, 0), u.Input))
	return ((float64(u.Input)-cached)*pr.Input + cached*pr.CachedInputPrice() + float64(u.Output)*pr.Output) / 1e6
}

// Overage is the rule for an overage a bucket cannot cover.
func (p *Policy) Overage() Overage { return p.overage }

// Key returns the policy of the key with this name.
func (p *Policy) Key(name string) *KeyPolicy { return p.keys[name] }

// Keeps reports whether a bucket still belongs to this policy; a reload drops the
// buckets of dimensions, models and keys that are gone.
func (p *Policy) Keeps(k Key) bool {
	if k.Rule != "" {
		c := p.rules[ruleWindow{k.Rule, k.Window}]
		return c != nil && c.dim == k.Dim && c.kind == k.Kind
	}
	var minute, day Allowance
	var reqs bool
	switch k.Dim {
	case Model:
		m := p.models[k.ID]
		if m == nil {
			return false
		}
		minute, day, reqs = m.minute, m.day, m.requestLimit
	case APIKey:
		kp := p.keys[k.ID]
		if kp == nil {
			return false
		}
		minute, day, reqs = kp.minute, kp.day, kp.reqRate > 0
	default:
		if k.Dim >= NumDimensions {
			return false
		}
		d := &p.dims[k.Dim]
		minute, day, reqs = d.minute, d.day, d.requestLimit
	}
	switch k.Kind {
	case Requests:
		return reqs
	case TokensMinute:
		return minute.Limited()
	case TokensDay:
		return day.Limited()
	}
	return false
}

// Effective describes one dimension's limits in force, for /admin/effective and logs.
type Effective struct {
	Dimension string `json:"dimension"`
	Model     string `json:"model,omitempty"`
	Key       string `json:"api_key,omitempty"`
	// Configured are the fleet totals as written.
	ConfiguredTokensPerMinute int64 `json:"configured_tokens_per_minute"`
	ConfiguredTokensPerDay    int64 `json:"configured_tokens_per_day"`
	// TokensPerMinute and TokensPerDay are what this replica enforces; null is unlimited.
	TokensPerMinute   *int64  `json:"tokens_per_minute"`
	TokensPerDay      *int64  `json:"tokens_per_day"`
	RequestsPerSecond float64 `json:"requests_per_second,omitempty"`
	BurstCapacity     float64 `json:"burst_capacity,omitempty"`
}

func allowancePtr(a Allowance) *int64 {
	if !a.Limited() {
		return nil
	}
	n := a.Tokens()
	return &n
}

// Effective lists every configured dimension, model and key override.
func (p *Policy) Effective() []Effective {
	// One allocation: a large fleet has 50,000 keys.
	out := p.appendLimits(make([]Effective, 0, int(Model)+len(p.models)+len(p.keys)))
	for _, name := range slices.Sorted(maps.Keys(p.keys)) {
		out = append(out, p.keys[name].effective())
	}
	return out
}

// Allowances are the entries of Effective with a token allowance, the keys' in no set
// order: what the allowance metrics show, which a reload sets. A key with none, as
// most of a large fleet's are, is left out, and the keys are not sorted.
func (p *Policy) Allowances() []Effective {
	out := p.appendLimits(nil)
	for _, kp := range p.keys {
		if kp.minute.Limited() || kp.day.Limited() {
			out = append(out, kp.effective())
		}
	}
	return out
}

// appendLimits appends the configured dimensions and models to out.
func (p *Policy) appendLimits(out []Effective) []Effective {
	for d := Global; d < Model; d++ {
		dp := &p.dims[d]
		if !dp.configured {
			continue
		}
		out = append(out, dp.effective(d.String(), ""))
	}
	for _, m := range slices.Sorted(maps.Keys(p.models)) {
		out = append(out, p.models[m].effective(Model.String(), m))
	}
	return out
}

func (kp *KeyPolicy) effective() Effective {
	return Effective{
		Dimension: APIKey.String(), Key: kp.Name,
		ConfiguredTokensPerMinute: kp.minute.fleet, ConfiguredTokensPerDay: kp.day.fleet,
		TokensPerMinute: allowancePtr(kp.minute), TokensPerDay: allowancePtr(kp.day),
		RequestsPerSecond: kp.reqRate, BurstCapacity: kp.reqBurst,
	}
}

func (dp *dimPolicy) effective(dim, model string) Effective {
	return Effective{
		Dimension: dim, Model: model,
		ConfiguredTokensPerMinute: dp.limits.TokensPerMinute, ConfiguredTokensPerDay: dp.limits.TokensPerDay,
		TokensPerMinute: allowancePtr(dp.minute), TokensPerDay: allowancePtr(dp.day),
		RequestsPerSecond: dp.reqRate, BurstCapacity: dp.reqBurst,
	}
}
