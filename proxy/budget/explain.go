// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package budget

import (
	"cmp"
	"context"
	"maps"
	"slices"
	"time"
)

// Explanation is every budget that applies to one identity's requests, as the limiter
// resolves them for admission: the same walk over the same compiled counters, so it
// never disagrees with what a request is charged.
type Explanation struct {
	APIKey string `json:"api_key"`
	User   string `json:"user,omitempty"`
	Team   string `json:"team,omitempty"`
	// Tenant is the key's tenant; empty for the platform's own keys.
	Tenant string `json:"tenant,omitempty"`
	Model  string `json:"model,omitempty"`
	// Charged: the route is charged, so every amount applies; otherwise only the
	// request counts do.
	Charged bool `json:"charged"`
	// Bypass: the key is exempt, and nothing applies.
	Bypass bool `json:"bypass,omitempty"`
	// Divisor is the budget division: a replica's memory holds 1/Divisor of each
	// rolling fleet total.
	Divisor int64 `json:"budget_division_replicas"`
	// Budgets are the buckets and in-flight windows a request draws on, in the order
	// they are taken.
	Budgets []Explained `json:"budgets"`
	// Replaced are the budgets that would apply but for a budget of this identity's
	// own that replaces them.
	Replaced []Replaced `json:"replaced,omitempty"`
	// Tightest is the Order of the enforcing budget with the smallest share left now;
	// 0 when no level is known or every bucket is whole.
	Tightest int `json:"tightest,omitempty"`
	// Levels says where the levels were read: "shared" (the fleet's totals in the
	// shared store), "memory" (this replica's share), or "" when unread; LevelsError
	// says why they were not.
	Levels      string `json:"levels,omitempty"`
	LevelsError string `json:"levels_error,omitempty"`
	// Unresolved names the dimensions with budgets this identity does not resolve:
	// client (a client address is the caller's, not the key's), model (no model).
	Unresolved []string `json:"unresolved,omitempty"`
	// NotSelected are the rule windows whose applies_when this request's attributes
	// do not match: they do not apply to it.
	NotSelected []NotSelected `json:"not_selected,omitempty"`
	// MaxAttributeValues is the bound on a key's distinct client-supplied values per
	// rule window, when a budget counts by one; ValuesError says why the store could
	// not tell whether a value is beyond it.
	MaxAttributeValues int64  `json:"max_attribute_values,omitempty"`
	ValuesError        string `json:"values_error,omitempty"`
	// InFlightError says why the fleet's slots in flight were not read: the counts
	// shown are then this replica's, which decide while the fleet's cannot.
	InFlightError string `json:"in_flight_error,omitempty"`
}

// AttributeValue is one request attribute a budget selects on or counts by, and the
// explained request's value of it.
type AttributeValue struct {
	// Attribute is its word in rules (session, provider, ...); Use is "applies_when"
	// or "count_by".
	Attribute string `json:"attribute"`
	Use       string `json:"use"`
	// Value is the request's value; Absent: a client-supplied attribute the request
	// does not send (its key's one value without an id), or one it has none of.
	Value  string `json:"value,omitempty"`
	Absent bool   `json:"absent,omitempty"`
	// Upstream is the serving upstream's name, for provider: a selector matches its
	// family (Value) or its name, and count_by counts by the name.
	Upstream string `json:"upstream,omitempty"`
}

// NotSelected is a rule window an applies_when selector leaves out.
type NotSelected struct {
	Rule   string `json:"rule"`
	Tenant string `json:"tenant,omitempty"`
	Window string `json:"window"`
	// Attribute is the first selector the request does not match: its value is not
	// one of Values.
	Attribute AttributeValue `json:"attribute"`
	Values    []string       `json:"values"`
}

// Explained is one bucket a request draws on.
type Explained struct {
	// Order is its place in the admission, from 1: the in-flight windows first, then
	// the request counts, then every other amount.
	Order int `json:"order"`
	// Source is "limits" (a dimension's limits), "api_key" (the key's own override of
	// per_api_key) or "rule"; Rule names the rule.
	Source string `json:"source"`
	Rule   string `json:"rule,omitempty"`
	// Tenant is the tenant whose budget it is; empty for the platform's.
	Tenant string `json:"tenant,omitempty"`
	// Window is the period (second, minute, hour, day, or calendar_day, _week, _month),
	// or in_flight.
	Window    string `json:"window"`
	Dimension string `json:"dimension"`
	// Subject is the identity's value in the dimension (empty for global); By its
	// count_by value.
	Subject string `json:"subject,omitempty"`
	CountBy string `json:"count_by,omitempty"`
	By      string `json:"by,omitempty"`
	Amount  string `json:"amount"`
	Warn    bool   `json:"warn,omitempty"`
	Durable bool   `json:"durable,omitempty"`
	// Own: the budget is the key's own (api_key, or counted by api_key), so refusals
	// and headers tell its level.
	Own bool `json:"own,omitempty"`
	// Limit and RatePerSecond are the fleet totals, as a shared store holds them;
	// ReplicaLimit and ReplicaRatePerSecond are one replica's share, what each replica
	// enforces in memory mode (a calendar window is never divided).
	Limit                float64 `json:"limit"`
	RatePerSecond        float64 `json:"rate_per_second,omitempty"`
	ReplicaLimit         float64 `json:"replica_limit"`
	ReplicaRatePerSecond float64 `json:"replica_rate_per_second,omitempty"`
	// Remaining is the bucket's level now, of the capacity Levels names; UsedPercent
	// the share of it used. Nil when not read.
	Remaining   *float64 `json:"remaining,omitempty"`
	UsedPercent *float64 `json:"used_percent,omitempty"`
	// LevelWithheld: the caller may not read the level of this budget (the
	// platform's, for a reader of only the key's tenant).
	LevelWithheld bool `json:"level_withheld,omitempty"`
	// ResetsAt is when a calendar window starts again.
	ResetsAt *time.Time `json:"resets_at,omitempty"`
	// Replaces are the Replaced entries this budget stands in for.
	Replaces []string `json:"replaces,omitempty"`
	// Attributes are the attributes it selects on (applies_when) and counts by
	// (count_by), with the request's values: By is the counter they land in.
	Attributes []AttributeValue `json:"attributes,omitempty"`
	// Overflow: the request's count_by value is beyond its key's max_attribute_values
	// distinct values this window, so it lands in the overflow subject (By).
	Overflow bool `json:"overflow,omitempty"`
	// InFlight is an in_flight window's requests in flight now in the counter the
	// request takes a slot of (Remaining is what is left of Limit); InFlightOf says
	// whose they are: "fleet" (every replica's, in Redis' leased slots) or "replica"
	// (this replica's own, held to the limit alone). Nil when not read.
	InFlight   *int64 `json:"in_flight,omitempty"`
	InFlightOf string `json:"in_flight_of,omitempty"`
}

// Replaced is a budget an identity's own budget replaces.
type Replaced struct {
	// What names it as Explained.Name does; By names the budget that replaces it.
	What string `json:"what"`
	By   string `json:"by"`
}

// Name is how an explained budget is named in Replaced: "rule NAME WINDOW", "the
// key's own WINDOW limit", or "limits DIMENSION WINDOW".
func (e *Explained) Name() string {
	switch {
	case e.Rule != "":
		return "rule " + e.Rule + " " + e.Window
	case e.Source == "api_key":
		return "the key's own " + e.Window + " limit"
	}
	return "limits " + e.Dimension + " " + e.Window
}

// Peeker is a store that reads a bucket's level without taking from it.
type Peeker interface {
	// Peek is the bucket's level now (an absent bucket is full), and whether the store
	// holds the fleet's totals (a shared store) rather than this replica's share.
	Peek(ctx context.Context, ch Charge) (level float64, shared bool, err error)
}

// Explain resolves every budget the identity's requests draw on, on a charged route
// or not, and reads each bucket's level when the store can (Peeker). It takes
// nothing and counts nothing.
func (l *Limiter) Explain(ctx context.Context, p *Policy, id Identity, charged bool) Explanation {
	e := Explanation{Model: id.Model, Charged: charged, Divisor: p.Divisor, Budgets: []Explained{}}
	if id.Key != nil {
		e.APIKey, e.User, e.Team, e.Tenant, e.Bypass = id.Key.Name, id.Key.User, id.Key.Team, id.Key.Tenant, id.Key.Bypass
	}
	if e.Bypass || id.Exempt {
		return e
	}
	quiet := &Limiter{store: l.store, rec: NopRecorder{}, clock: l.clock}
	c := charges{explain: true}
	quiet.collect(p, &id, &c, &Ask{}, charged)
	over := quiet.peekValues(ctx, p, &e, &c)
	for i := range c.slots {
		a := &c.slots[i]
		x := explained(len(e.Budgets)+1, Charge{Key: a.Key, ctr: a.ctr}, id.Key)
		x.Attributes, x.Overflow = attributesOf(a.ctr, &id), over[i]
		e.Budgets = append(e.Budgets, x)
	}
	all := slices.Concat(c.reqs, c.toks)
	for i, ch := range all {
		x := explained(len(e.Budgets)+1, ch, id.Key)
		x.Attributes, x.Overflow = attributesOf(ch.ctr, &id), over[len(c.slots)+i]
		e.Budgets = append(e.Budgets, x)
	}
	e.NotSelected = notSelected(c.unselected, &id)
	e.Replaced = replaced(p, &id, e.Budgets)
	levels := p.levelsOf(id.Key)
	if id.Client == "" && slices.ContainsFunc(levels, func(lv *level) bool { return len(lv.counters[Client]) > 0 }) {
		e.Unresolved = append(e.Unresolved, Client.String())
	}
	if id.Model == "" && slices.ContainsFunc(levels, func(lv *level) bool { return len(lv.byModel) > 0 || len(lv.counters[Model]) > 0 }) {
		e.Unresolved = append(e.Unresolved, Model.String())
	}
	quiet.levels(ctx, &e, all, len(c.slots))
	l.inFlight(ctx, &e, c.slots)
	e.Tightest = tightestOf(e.Budgets)
	return e
}

// inFlight reads the slots in flight of the in-flight windows, the first budgets of
// e, where an admission now would take them.
func (l *Limiter) inFlight(ctx context.Context, e *Explanation, asks []SlotAsk) {
	if len(asks) == 0 {
		return
	}
	fleet, why := l.peekSlots(ctx, asks)
	e.InFlightError = why
	for i := range asks {
		b, n := &e.Budgets[i], asks[i].Held
		if n < 0 {
			continue
		}
		b.InFlight, b.InFlightOf = &n, "replica"
		if fleet {
			b.InFlightOf = "fleet"
		}
		left := float64(asks[i].Limit - n)
		b.Remaining = &left
		if asks[i].Limit > 0 {
			used := 100 * float64(n) / float64(asks[i].Limit)
			b.UsedPercent = &used
		}
	}
}

// explained describes one charge of the reservation.
func explained(order int, ch Charge, key *KeyPolicy) Explained {
	ctr := ch.ctr
	x := Explained{
		Order: order, Source: "limits", Rule: ctr.rule, Tenant: ctr.tenant, Window: ctr.name, Dimension: ctr.dim.String(),
		Subject: ch.Key.ID, By: ch.Key.By, Amount: ctr.amount.String(), Warn: ctr.warn, Durable: ctr.durable, Own: ctr.scoped,
		Limit: ctr.sharedCapacity, RatePerSecond: ctr.sharedRate, ReplicaLimit: ctr.capacity, ReplicaRatePerSecond: ctr.rate,
	}
	if ctr.rule != "" {
		x.Source = "rule"
	} else if ctr.dim == APIKey && key != nil && overridden(key, ctr.kind) {
		x.Source = "api_key"
	}
	if ctr.countBy != NumAttrs {
		x.CountBy = ctr.countBy.String()
	}
	if ctr.kind == Calendar {
		t := time.UnixMilli(ch.EndMillis).UTC()
		x.ResetsAt = &t
	}
	return x
}

// Withhold hides the levels of the budgets whose tenant the caller may not read (may
// says), and names the tightest of those it may.
func (e *Explanation) Withhold(may func(tenant string) bool) {
	mayOf := map[string]bool{}
	for i := range e.Budgets {
		b := &e.Budgets[i]
		ok, seen := mayOf[b.Tenant]
		if !seen {
			ok = may(b.Tenant)
			mayOf[b.Tenant] = ok
		}
		if !ok && (b.Remaining != nil || b.InFlight != nil) {
			b.Remaining, b.UsedPercent, b.InFlight, b.LevelWithheld = nil, nil, nil, true
		}
	}
	e.Tightest = tightestOf(e.Budgets)
}

// tightestOf is the Order of the enforcing budget with the smallest share left, of
// those whose level is known; 0 when every one is whole. A zero allowance admits
// nothing: nothing is tighter.
func tightestOf(budgets []Explained) int {
	tightest, least := 0, 1.0
	for i := range budgets {
		b := &budgets[i]
		if b.Remaining == nil || b.Warn {
			continue
		}
		left := 0.0
		if b.UsedPercent != nil {
			left = 1 - *b.UsedPercent/100
		}
		if left < least {
			least, tightest = left, b.Order
		}
	}
	return tightest
}

// overridden reports whether the key's own value sets its limit of this kind.
func overridden(k *KeyPolicy, kind Kind) bool {
	switch kind {
	case Requests:
		return k.overrides[0]
	case TokensMinute:
		return k.overrides[1]
	case TokensDay:
		return k.overrides[2]
	}
	return false
}

// replaced lists the counters that would govern the identity but that a budget of
// its own replaces (a named-subject rule, or the key's override of per_api_key), and
// marks each replacing budget.
func replaced(p *Policy, id *Identity, budgets []Explained) []Replaced {
	var out []Replaced
	add := func(what, by string) {
		out = append(out, Replaced{What: what, By: by})
		for i := range budgets {
			if budgets[i].Name() == by {
				budgets[i].Replaces = append(budgets[i].Replaces, what)
			}
		}
	}
	// The key's overrides replace per_api_key's values.
	if id.Key != nil {
		for i := range budgets {
			b := &budgets[i]
			if b.Source == "api_key" {
				add("limits api_key "+b.Window, b.Name())
			}
		}
	}
	// A named-subject counter replaces the each-subject counters of its group.
	var each []*counter
	for _, lv := range p.levelsOf(id.Key) {
		for d := range lv.counters {
			each = append(each, lv.counters[d]...)
		}
	}
	each = append(each, slices.SortedFunc(maps.Values(p.rules), func(a, b *counter) int {
		return cmp.Or(cmp.Compare(p.order[a.rule], p.order[b.rule]), cmp.Compare(a.window, b.window))
	})...)
	if id.Key != nil {
		each = append(each, p.replacedOf(id.Key)...)
	}
	seen := map[*counter]bool{}
	for _, ctr := range each {
		subject := id.value(ctr.dim)
		if seen[ctr] || ctr.subjects != nil || subject == "" || (ctr.models != nil && !ctr.models.has(id.Model)) {
			continue
		}
		if !ctr.excluded.has(subject) && !slices.Contains(p.replacedOf(id.Key), ctr) {
			continue
		}
		seen[ctr] = true
		what := Explained{Source: "limits", Rule: ctr.rule, Window: ctr.name, Dimension: ctr.dim.String()}
		if ctr.rule != "" {
			what.Source = "rule"
		}
		for i := range budgets {
			if b := &budgets[i]; b.Rule != "" && replaces(p, b, ctr, subject) {
				add(what.Name(), b.Name())
				break
			}
		}
	}
	return out
}

// levelsOf are the levels a key's requests are checked against: the platform's, then
// its tenant's.
func (p *Policy) levelsOf(k *KeyPolicy) []*level {
	if k != nil && k.level != nil {
		return []*level{&p.platform, k.level}
	}
	return []*level{&p.platform}
}

// replacedOf is the key's replaced limits; nil for no key.
func (p *Policy) replacedOf(k *KeyPolicy) []*counter {
	if k == nil {
		return nil
	}
	return p.replaced[k.Name]
}

// replaces reports whether the explained rule window is the named-subject counter
// that replaces ctr for subject.
func replaces(p *Policy, b *Explained, ctr *counter, subject string) bool {
	for _, w := range p.rules {
		if w.rule == b.Rule && w.name == b.Window && w.group == ctr.group && w.subjects.has(subject) {
			return true
		}
	}
	return false
}

// levels reads each bucket's level from the store, into the budgets from e.Budgets[at]
// on.
func (l *Limiter) levels(ctx context.Context, e *Explanation, charges []Charge, at int) {
	pk, ok := l.store.(Peeker)
	if !ok || len(charges) == 0 {
		return
	}
	for i, ch := range charges {
		level, shared, err := pk.Peek(ctx, ch)
		if err != nil {
			e.Levels, e.LevelsError = "", err.Error()
			for j := range charges {
				e.Budgets[at+j].Remaining, e.Budgets[at+j].UsedPercent = nil, nil
			}
			return
		}
		capacity := ch.Capacity
		e.Levels = "memory"
		if shared {
			capacity, e.Levels = ch.SharedCapacity, "shared"
		}
		b := &e.Budgets[at+i]
		b.Remaining = &level
		if capacity > 0 {
			used := 100 * (1 - level/capacity)
			b.UsedPercent = &used
		}
	}
}

// ValuePeeker is a ValueBounder that tells, admitting nothing, which asks a
// BoundValues now would find beyond their limit.
type ValuePeeker interface {
	// PeekValues sets each ask's Over as BoundValues would, and adds no value.
	PeekValues(ctx context.Context, asks []ValueAsk) error
}

// peekValues tells which of the reservation's client-supplied count_by values are
// beyond their bound, and moves those charges to the overflow subject as admission
// would. It returns, per slot, then charge of reqs then toks, whether it overflowed.
func (l *Limiter) peekValues(ctx context.Context, p *Policy, e *Explanation, c *charges) []bool {
	over := make([]bool, len(c.slots)+len(c.reqs)+len(c.toks))
	if len(c.asks) == 0 {
		return over
	}
	e.MaxAttributeValues = p.maxValues
	if vp, ok := l.store.(ValuePeeker); !ok {
		e.ValuesError = "the store does not tell its values"
		return over
	} else if err := vp.PeekValues(ctx, c.asks); err != nil {
		e.ValuesError = err.Error()
		return over
	}
	for i := range c.asks {
		a := &c.asks[i]
		if !a.Over {
			continue
		}
		at := c.askAt[i]
		k, _ := c.keyAt(at)
		k.By = overflowBy(k.Dim, a.Key)
		switch {
		case at < 0:
			over[len(c.slots)-int(at)-1] = true
		case at < slotAt:
			over[len(c.slots)+len(c.reqs)+int(at)] = true
		default:
			over[int(at)-slotAt] = true
		}
	}
	return over
}

// attributesOf are the attributes a counter selects on and counts by, with the
// identity's values.
func attributesOf(ctr *counter, id *Identity) []AttributeValue {
	var out []AttributeValue
	if ctr.models != nil && ctr.rule != "" {
		out = append(out, attributeValue(AttrModel, "applies_when", id))
	}
	for i := range ctr.when {
		out = append(out, attributeValue(ctr.when[i].attr, "applies_when", id))
	}
	if ctr.countBy != NumAttrs {
		out = append(out, attributeValue(ctr.countBy, "count_by", id))
	}
	return out
}

// attributeValue is the identity's value of a: for a provider selector the serving
// upstream's family, with its name beside it.
func attributeValue(a Attr, use string, id *Identity) AttributeValue {
	v := AttributeValue{Attribute: a.String(), Use: use, Value: id.attr(a)}
	if a == AttrProvider {
		v.Upstream = id.Upstream
		if use == "applies_when" && id.Provider != "" {
			v.Value = id.Provider
		}
	}
	v.Absent = v.Value == ""
	return v
}

// notSelected describes the counters an applies_when selector left out, each rule
// window once, by the first selector the identity does not match.
func notSelected(ctrs []*counter, id *Identity) []NotSelected {
	var out []NotSelected
	seen := map[*counter]bool{}
	for _, ctr := range ctrs {
		if seen[ctr] {
			continue
		}
		seen[ctr] = true
		for i := range ctr.when {
			s := &ctr.when[i]
			if s.matches(id) {
				continue
			}
			out = append(out, NotSelected{Rule: ctr.rule, Tenant: ctr.tenant, Window: ctr.name,
				Attribute: attributeValue(s.attr, "applies_when", id), Values: s.values.sorted()})
			break
		}
	}
	return out
}
