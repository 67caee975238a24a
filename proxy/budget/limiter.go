// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package budget

import (
	"context"
	"errors"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tokenwarden/tokenwarden/proxy/config"
)

// Outcome is what happened to tokens on a bucket.
type Outcome uint8

// Token outcomes, as the metrics name them.
const (
	Reserved Outcome = iota
	Refunded
	Charged
	NumOutcomes
)

var outcomeNames = [NumOutcomes]string{"reserved", "refunded", "charged"}

func (o Outcome) String() string { return outcomeNames[o] }

// Recorder receives the limiter's decisions for metrics. Implementations must be safe
// for concurrent use and cheap: they are called on the request path.
type Recorder interface {
	// Tokens records n tokens of outcome on a dimension, once per dimension (across
	// periods), and once per period bucket with the period's kind.
	DimensionTokens(d Dimension, o Outcome, n float64)
	PeriodTokens(d Dimension, period Kind, o Outcome, n float64)
	// TokenRefusal records a refusal by a dimension's period.
	TokenRefusal(d Dimension, period Kind)
	// RequestRefusal records a refusal by a dimension's request-count bucket.
	RequestRefusal(d Dimension)
	// Skipped records a dimension skipped for a missing identity
	// ("token_budget_<dimension>"), or a full bucket map that failed open
	// ("token_budget", "token_budget_day", "request_rate").
	Skipped(label string)
	// BucketMapFull records a bucket not created because the map of its dimension and
	// kind was full: the request was admitted on that bucket without charge. It comes
	// with the Skipped record of the same event, which does not name the dimension.
	BucketMapFull(d Dimension, k Kind)
	// KeyTokens records tokens of outcome on an API key's budget.
	KeyTokens(key string, o Outcome, n float64)
	// RedisUnavailable records an admission that found the shared store unreachable,
	// per dimension, with the action taken ("fallback_memory" or "fail_closed").
	RedisUnavailable(d Dimension, action string)
	// RedisPipeline records one pipeline sent to the shared store: how long Redis
	// took to answer it, and the reservations, refunds and overage charges it carried.
	RedisPipeline(d time.Duration, reservations, refunds, charges int)
	// Rule returns the recorder of one rule window, by the rule's name and the
	// window's (called once per window and policy).
	Rule(rule, window string) RuleRecorder
	// DurableRefused records a request refused with 503 because a durable rule's
	// bucket could not be held (Redis unreachable, or a full map), by the dimension of
	// its first durable bucket.
	DurableRefused(d Dimension)
}

// RuleOutcome is what a rule's window did with one request.
type RuleOutcome uint8

// Rule outcomes, as the metrics name them.
const (
	// RuleAdmitted: the request fit and was charged.
	RuleAdmitted RuleOutcome = iota
	// RuleRefused: the window refused the request.
	RuleRefused
	// RuleWarned: the request did not fit a warn rule's window; it was admitted and
	// took nothing from it.
	RuleWarned
	NumRuleOutcomes
)

var ruleOutcomeNames = [NumRuleOutcomes]string{"admitted", "refused", "warned"}

func (o RuleOutcome) String() string { return ruleOutcomeNames[o] }

// RuleRecorder counts one rule window's decisions and the amounts it moved.
type RuleRecorder interface {
	// Decision records what the window did with a request.
	Decision(o RuleOutcome)
	// Amount records an amount of outcome, in the rule's units.
	Amount(o Outcome, n float64)
	// Overflowed records a request whose client-supplied count_by value came beyond
	// its key's bound of distinct values (max_attribute_values): it is counted in the
	// overflow subject.
	Overflowed()
	// Level records the bucket a request just drew on: the share of its limit in use
	// (0 full, 1 empty, above 1 in debt), the limit in the rule's amount, and for a
	// calendar window when it resets (zero for a rolling window).
	Level(used, limit float64, amount Amount, reset time.Time)
}

// Identity is who a request is, as far as the dimensions care.
type Identity struct {
	// Key is the authenticated API key; nil for anonymous traffic.
	Key *KeyPolicy
	// Client is the client address; empty when unknown.
	Client string
	// Model is the resolved client-facing model name; empty when unknown.
	Model string
	// Exempt is true for a whitelisted client: no limit applies.
	Exempt bool
	// Provider is the serving upstream's provider family and Upstream its name;
	// Endpoint the route family (config's endpoint words).
	Provider, Upstream, Endpoint string
	// Session, Agent, Task and Run are the client's headers (package attribute), and
	// Fingerprint the hash of the request as forwarded: read only when a rule of the
	// policy uses them (Policy.Reads).
	Session, Agent, Task, Run, Fingerprint string
}

// attr is the identity's value of an attribute; empty when it has none (a
// client-supplied attribute's empty value is a value: attribute.Absent).
func (id *Identity) attr(a Attr) string {
	if d, ok := a.Dimension(); ok {
		return id.value(d)
	}
	switch a {
	case AttrProvider:
		return id.Upstream
	case AttrEndpoint:
		return id.Endpoint
	case AttrEnvironment:
		if id.Key != nil {
			return id.Key.Environment
		}
	case AttrSession:
		return id.Session
	case AttrAgent:
		return id.Agent
	case AttrTask:
		return id.Task
	case AttrRun:
		return id.Run
	case AttrFingerprint:
		return id.Fingerprint
	}
	return ""
}

// value is the identity's subject in a dimension; empty when it has none.
func (id *Identity) value(d Dimension) string {
	switch d {
	case Client:
		return id.Client
	case Model:
		return id.Model
	}
	if id.Key == nil {
		return ""
	}
	switch d {
	case APIKey:
		return id.Key.Name
	case User:
		return id.Key.User
	case Team:
		return id.Key.Team
	case Tenant:
		return id.Key.Tenant
	}
	return ""
}

// Ask is what a request asks of its budgets: its input estimate and its output
// ceiling. A zero Ask (a route that is not charged) draws only on request counts.
type Ask struct {
	Input, Output int64
}

// Used is what a request consumed, as the backend reported it.
type Used struct {
	// Input counts every input token, Cached of them read from the prompt cache.
	Input, Output, Cached int64
}

// Status is one identity-scoped bucket's state for response headers.
type Status struct {
	Present   bool
	Limit     int64
	Remaining int64
	// Reset is when the bucket is whole again.
	Reset time.Time
}

// Dollars is an identity-scoped cost budget's state for response headers.
type Dollars struct {
	Present          bool
	Limit, Remaining float64
	Reset            time.Time
}

// Warning names a warn rule's window that a request did not fit.
type Warning struct {
	Rule, Window string
}

// Refusal says why a request was refused.
type Refusal struct {
	// Requests is true for a request-count refusal, false for a token budget.
	Requests  bool
	Dimension Dimension
	// Period is TokensMinute or TokensDay for a token refusal by limits; Rolling or
	// Calendar for one by a rule.
	Period Kind
	// Rule, Window and Amount name a refusing rule's window; Rule is empty for
	// limits. Scoped: the rule is the caller's own (api_key, or counted by api_key),
	// so a refusal may name it; a shared rule's name and level are never told.
	Rule, Window string
	Amount       Amount
	Scoped       bool
	// WindowIndex is the refusing window's index in its rule's windows.
	WindowIndex uint8
	// BothPeriods: the refusing dimension has a minute and a day budget, so the
	// refusal names the period (details.token_budget).
	BothPeriods bool
	RetryAfter  time.Duration
	// LargerThanBucket: the request is larger than the whole refusing bucket, so no
	// wait lets it in (RetryAfter is then the time its own cost takes to refill). The
	// refusal names that bucket's dimension and period.
	LargerThanBucket bool
	// Asked is what the request reserved on the refusing bucket, in its units.
	Asked float64
	// Bucket is the refusing bucket's capacity and level, set only for an
	// identity-scoped bucket; a shared one never reveals its level. Cost is the same
	// for a cost budget.
	Bucket Status
	Cost   Dollars
}

// Decision is the outcome of admission.
type Decision struct {
	// Hold is the reservation to settle or release; nil when nothing was reserved (no
	// budget beyond request counts applies, or the request was refused).
	Hold *Hold
	// Refusal is non-nil when the request must be refused.
	Refusal *Refusal
	// KeyMinute, KeyDay and KeyRequests describe the caller's own tightest buckets,
	// for the x-ratelimit-* headers: tokens over a window shorter than a day, tokens
	// over a day or longer, and requests. KeyInput, KeyOutput and KeyCost do the same
	// for the input_tokens, output_tokens and cost amounts. With limits only they are
	// the api_key minute, day and request buckets. Shared dimensions are never
	// reported.
	KeyMinute, KeyDay, KeyRequests Status
	KeyInput, KeyOutput            Status
	KeyCost                        Dollars
	// Warnings are the warn rules' windows the request did not fit.
	Warnings []Warning
	// FailedOpen: the request was admitted without every budget enforced as
	// configured: a bucket map was full, or the shared store was unreachable and the
	// replica's memory decided.
	FailedOpen bool
}

// Limiter admits requests against a Policy on a Store.
type Limiter struct {
	store Store
	rec   Recorder
	clock Clock
	// async is for stores that make a network call: a settlement or release that
	// waits for the store runs on a detached goroutine (a RefundSender's refunds do
	// not wait). pending counts those goroutines and the refunds sent and not yet
	// applied, so that a stopping proxy waits for them.
	async   bool
	pending sync.WaitGroup
	// slots keep the rules' in-flight counters as the fleet's totals (slots.go);
	// memSlots are this replica's, without them or while they cannot decide.
	slots    Slots
	memSlots memorySlots
}

// NewLimiter returns a limiter on store. async settles what waits for the store off
// the request's goroutine.
func NewLimiter(store Store, rec Recorder, clock Clock, async bool) *Limiter {
	return &Limiter{store: store, rec: rec, clock: clock, async: async}
}

// CalendarStore is a store that keeps its own clock for calendar windows (the Redis
// server's): it tells the present its windows are told on.
type CalendarStore interface {
	// CalendarNow is the present as the store's calendar windows see it, and how far
	// that present is shifted from the store's own clock (0 except in tests, which
	// stand in another month).
	CalendarNow() (now time.Time, shift time.Duration)
}

// span is a calendar window: it started at start and the next one starts at end.
type span struct{ start, end time.Time }

// spanAt is the calendar window of a counter that holds now; the last one found is
// kept, so a request computes a window only when one ends.
func (c *counter) spanAt(now time.Time) *span {
	sp := c.span.Load()
	if sp == nil || now.Before(sp.start) || !now.Before(sp.end) {
		start, end := c.calendar.Span(now)
		sp = &span{start: start, end: end}
		c.span.Store(sp)
	}
	return sp
}

// charges are the buckets a request draws on. They are lent by a pool and keep the
// capacity they grew to, so a policy with many counters allocates none on the hot
// path once warm.
type charges struct {
	reqs []Charge
	toks []Charge
	res  Reservation
	// asks are the client-supplied count_by values to bound, and askAt where each
	// one's charge is: an index of toks, or -(i+1) for reqs[i].
	asks  []ValueAsk
	askAt []int32
	// slots are the in-flight windows the request takes a slot of.
	slots []SlotAsk
	// explain collects into unselected the counters an applies_when selector left
	// out (Limiter.Explain); admission never sets it.
	explain    bool
	unselected []*counter
}

// slotAt is an ask's place for slots[i]: beyond any index of toks.
const slotAt = 1 << 30

var chargesPool = sync.Pool{New: func() any { return new(charges) }}

// heldPool lends the charges of holds.
var heldPool = sync.Pool{New: func() any { return new([]Charge) }}

// add appends the bucket of one counter for a subject.
func (c *charges) add(l *Limiter, p *Policy, ctr *counter, id *Identity, ident, by string, ask *Ask) {
	ch := Charge{
		Key:      Key{Kind: ctr.kind, Dim: ctr.dim, Window: ctr.window, ID: ident, Tenant: ctr.tenant, Rule: ctr.rule, By: by},
		Capacity: ctr.capacity, Rate: ctr.rate, SharedCapacity: ctr.sharedCapacity, SharedRate: ctr.sharedRate,
		Period: ctr.period, Warn: ctr.warn, Durable: ctr.durable, ctr: ctr,
	}
	switch ctr.amount {
	case AmountRequests:
		ch.Amount = 1
	case AmountTokens:
		ch.Amount = float64(ask.Input + ask.Output)
	case AmountInput:
		ch.Amount = float64(ask.Input)
	case AmountOutput:
		ch.Amount = float64(ask.Output)
	case AmountCost:
		// Cached input is unknown until the backend answers: it is reserved at the full
		// input price.
		pr := p.price(id.Model)
		ch.Amount = (float64(ask.Input)*pr.Input + float64(ask.Output)*pr.Output) / 1e6
	}
	if ctr.kind == Calendar {
		now, shift := l.clock.Now(), time.Duration(0)
		if cs, ok := l.store.(CalendarStore); ok {
			now, shift = cs.CalendarNow()
		}
		sp := ctr.spanAt(now)
		ch.Key.Start, ch.EndMillis = sp.start.Unix(), sp.end.Add(-shift).UnixMilli()
	}
	if ctr.countBy.Supplied() {
		c.ask(p, &ch, id)
	}
	switch ctr.amount {
	case AmountInFlight:
		c.slots = append(c.slots, SlotAsk{Key: ch.Key, Limit: int64(ctr.sharedCapacity), Held: -1, ctr: ctr})
		return
	case AmountRequests:
		c.reqs = append(c.reqs, ch)
	default:
		c.toks = append(c.toks, ch)
	}
}

// ask records the client-supplied count_by value of a charge for the bound of
// distinct values (BoundValues), and counts it under the key that sent it: a rule
// whose subject is not the key itself holds it as KEY/VALUE.
func (c *charges) ask(p *Policy, ch *Charge, id *Identity) {
	var key string
	if id.Key != nil {
		key = id.Key.Name
	}
	a := ValueAsk{Rule: ch.Key.Rule, Window: ch.Key.Window, Key: key, Value: ch.Key.By, Limit: p.maxValues,
		Epoch: ch.ctr.period, Start: ch.Key.Start, TTL: 2 * ch.ctr.period}
	if ch.ctr.kind == Calendar {
		a.Epoch, a.TTL = 0, time.Until(time.UnixMilli(ch.EndMillis))+time.Minute
	}
	at := int32(len(c.toks))
	switch ch.ctr.amount {
	case AmountRequests:
		at = -int32(len(c.reqs)) - 1
	case AmountInFlight:
		at = slotAt + int32(len(c.slots))
	}
	c.asks, c.askAt = append(c.asks, a), append(c.askAt, at)
	if ch.Key.Dim != APIKey {
		ch.Key.By = key + "/" + ch.Key.By
	}
}

// boundValues asks the store to bound the client-supplied count_by values of the
// reservation; a value beyond its key's bound is counted in the overflow subject.
func (l *Limiter) boundValues(ctx context.Context, c *charges) error {
	if vb, ok := l.store.(ValueBounder); ok {
		if err := vb.BoundValues(ctx, c.asks); err != nil {
			return err
		}
	}
	for i := range c.asks {
		a := &c.asks[i]
		if !a.Over {
			continue
		}
		k, ctr := c.keyAt(c.askAt[i])
		k.By = overflowBy(k.Dim, a.Key)
		l.stats(ctr).Overflowed()
	}
	return nil
}

// countDiverted counts the values a store moved to their key's overflow subject when
// it had no room for their counters (a memory map of values that is full).
func (l *Limiter) countDiverted(c *charges) {
	for i := range c.asks {
		if c.asks[i].Over || c.askAt[i] >= slotAt {
			continue
		}
		if k, ctr := c.keyAt(c.askAt[i]); isOverflow(k.By) {
			l.stats(ctr).Overflowed()
		}
	}
}

// keyAt is the key and counter of the charge or slot an ask's place names.
func (c *charges) keyAt(at int32) (*Key, *counter) {
	switch {
	case at < 0:
		return &c.reqs[-at-1].Key, c.reqs[-at-1].ctr
	case at >= slotAt:
		return &c.slots[at-slotAt].Key, c.slots[at-slotAt].ctr
	}
	return &c.toks[at].Key, c.toks[at].ctr
}

// collect resolves the buckets of every counter the identity draws on (beyond request
// counts only when tokens is set), and counts the dimensions skipped for a missing
// identity: the platform's counters first, then those of the key's tenant, so that a
// refusal by both names the platform's and a store that reserves in several calls
// takes the platform's first.
func (l *Limiter) collect(p *Policy, id *Identity, c *charges, ask *Ask, tokens bool) {
	c.reqs, c.toks, c.asks, c.askAt = c.reqs[:0], c.toks[:0], c.asks[:0], c.askAt[:0]
	c.slots = c.slots[:0]
	var keyList []*counter
	if id.Key != nil {
		keyList = id.Key.counters
	}
	l.collectLevel(p, &p.platform, keyList, id, c, ask, tokens, true)
	if id.Key != nil && id.Key.level != nil {
		l.collectLevel(p, id.Key.level, id.Key.tenantCounters, id, c, ask, tokens, false)
	}
}

// collectLevel resolves the buckets of one level's counters; keyList are the key's
// api_key counters of that level.
func (l *Limiter) collectLevel(p *Policy, lv *level, keyList []*counter, id *Identity, c *charges, ask *Ask, tokens, platform bool) {
	for d := Global; d < NumDimensions; d++ {
		list := lv.counters[d]
		var named []*counter
		ident := id.value(d)
		switch d {
		case APIKey:
			if id.Key == nil {
				if tokens && platform && p.skipTokens[APIKey] {
					l.rec.Skipped("token_budget_api_key")
				}
				continue
			}
			list = keyList
		case Model:
			if ident != "" {
				named = lv.byModel[ident]
			}
		}
		watched := platform && d == Model && p.skipTokens[Model]
		if len(list) == 0 && len(named) == 0 && !watched {
			continue
		}
		if d != Global && ident == "" {
			// A key of no tenant is the platform's: it skips no tenant budget.
			if tokens && d != Tenant && (!platform || p.skipTokens[d]) {
				l.rec.Skipped("token_budget_" + d.String())
			}
			continue
		}
		l.addAll(p, named, id, ident, c, ask, tokens)
		l.addAll(p, list, id, ident, c, ask, tokens)
	}
}

func (l *Limiter) addAll(p *Policy, list []*counter, id *Identity, ident string, c *charges, ask *Ask, tokens bool) {
	for _, ctr := range list {
		switch {
		case !tokens && ctr.amount != AmountRequests && ctr.amount != AmountInFlight,
			ctr.subjects != nil && !ctr.subjects.has(ident),
			ctr.excluded != nil && ctr.excluded.has(ident),
			ctr.models != nil && !ctr.models.has(id.Model):
			continue
		case ctr.when != nil && !ctr.selects(id):
			if c.explain {
				c.unselected = append(c.unselected, ctr)
			}
			continue
		}
		var by string
		if ctr.countBy != NumAttrs {
			by = id.attr(ctr.countBy)
			if by == "" && !ctr.countBy.Supplied() {
				continue
			}
		}
		c.add(l, p, ctr, id, ident, by, ask)
	}
}

// Admit reserves, on every bucket the identity draws on, the request's amount in
// that bucket's units, all or nothing. A zero ask (a route that is not charged) takes
// only the request-count buckets. An error means the store could not decide; nothing
// was taken.
func (l *Limiter) Admit(ctx context.Context, p *Policy, id Identity, ask Ask) (Decision, error) {
	var dec Decision
	if id.Exempt || (id.Key != nil && id.Key.Bypass) {
		return dec, nil
	}
	// The charges are lent by a pool: no store keeps a reservation once Reserve
	// returns, and the hold keeps its own copy of what it took.
	c := chargesPool.Get().(*charges)
	defer chargesPool.Put(c)
	l.collect(p, &id, c, &ask, ask.Input+ask.Output > 0)
	if len(c.reqs) == 0 && len(c.toks) == 0 && len(c.slots) == 0 {
		return dec, nil
	}
	if len(c.asks) > 0 {
		if err := l.boundValues(ctx, c); err != nil {
			return dec, err
		}
	}
	// In-flight slots first: a request they refuse reserves nothing, and every later
	// refusal or failure gives them back.
	var slots SlotHold
	if len(c.slots) > 0 {
		var refused int
		var alone bool
		if slots, refused, alone = l.takeSlots(ctx, c); refused >= 0 {
			dec.Refusal = inFlightRefusal(&c.slots[refused])
			return dec, nil
		}
		dec.FailedOpen = alone
		if len(c.reqs) == 0 && len(c.toks) == 0 {
			dec.Hold = &Hold{l: l, slots: slots}
			return dec, nil
		}
	}
	c.res = Reservation{Requests: c.reqs, Tokens: c.toks}
	res, err := l.store.Reserve(ctx, &c.res)
	if err != nil {
		if slots != nil {
			l.endSlots(slots)
		}
		var unavailable *UnavailableError
		var recovering *RecoveringError
		switch {
		case errors.As(err, &unavailable):
			l.recordDurable(c)
		case errors.As(err, &recovering):
			if fr, ok := l.rec.(FenceRecorder); ok {
				for _, ch := range append(c.reqs[:len(c.reqs):len(c.reqs)], c.toks...) {
					if ch.Durable {
						fr.DurableFenced(ch.Key.Dim)
						break
					}
				}
			}
		}
		return dec, err
	}
	dec.FailedOpen = dec.FailedOpen || slices.Contains(res.RequestSkipped, true) || slices.Contains(res.TokenSkipped, true) ||
		(res.Backend != nil && res.Backend != l.store)
	l.countDiverted(c)
	now := l.clock.Now()
	// A shared store decided on the fleet totals: report those.
	view := func(ch Charge) Charge {
		if res.Shared {
			return ch.Shared()
		}
		return ch
	}
	for i := range c.reqs {
		ch := &c.reqs[i]
		if ch.ctr.scoped && !ch.Warn && !res.RequestSkipped[i] {
			tightest(&dec.KeyRequests, view(*ch), res.RequestLevels[i], now)
		}
	}
	if res.Admitted || res.RefusedBy != Requests {
		l.recordSkipped(c.reqs, res.RequestSkipped)
		l.recordRules(c.reqs, res.RequestWarned, -1)
		l.recordLevels(c.reqs, res.RequestLevels, res.RequestSkipped, view)
	}
	if !res.Admitted {
		if slots != nil {
			l.endSlots(slots)
		}
		dec.Refusal = l.refusal(c, &res, now, view)
		return dec, nil
	}
	for i := range c.toks {
		ch := &c.toks[i]
		if !ch.ctr.scoped || ch.Warn || res.TokenSkipped[i] {
			continue
		}
		v, level := view(*ch), res.TokenLevels[i]
		switch ch.ctr.amount {
		case AmountTokens:
			if ch.Key.Kind == TokensDay || ch.Key.Kind == Calendar || ch.ctr.period >= 24*time.Hour {
				tightest(&dec.KeyDay, v, level, now)
			} else {
				tightest(&dec.KeyMinute, v, level, now)
			}
		case AmountInput:
			tightest(&dec.KeyInput, v, level, now)
		case AmountOutput:
			tightest(&dec.KeyOutput, v, level, now)
		case AmountCost:
			if !dec.KeyCost.Present || level < dec.KeyCost.Remaining {
				dec.KeyCost = Dollars{Present: true, Limit: v.Capacity, Remaining: max(level, 0), Reset: reset(v, level, now)}
			}
		}
	}
	l.recordSkipped(c.toks, res.TokenSkipped)
	l.recordRules(c.toks, res.TokenWarned, -1)
	l.recordLevels(c.toks, res.TokenLevels, res.TokenSkipped, view)
	for i, w := range res.RequestWarned {
		if w {
			dec.Warnings = append(dec.Warnings, Warning{Rule: c.reqs[i].Key.Rule, Window: c.reqs[i].ctr.name})
		}
	}
	for i, w := range res.TokenWarned {
		if w {
			dec.Warnings = append(dec.Warnings, Warning{Rule: c.toks[i].Key.Rule, Window: c.toks[i].ctr.name})
		}
	}
	n := 0
	for i := range c.toks {
		if !res.TokenSkipped[i] && (res.TokenWarned == nil || !res.TokenWarned[i]) {
			n++
		}
	}
	if n == 0 {
		if slots != nil {
			dec.Hold = &Hold{l: l, slots: slots}
		}
		return dec, nil
	}
	// The hold keeps its own copy of what it took, lent by a pool (no store keeps a
	// charge once an operation returns) until the hold is settled or released.
	buf := heldPool.Get().(*[]Charge)
	taken := slices.Grow((*buf)[:0], n)
	for i := range c.toks {
		if !res.TokenSkipped[i] && (res.TokenWarned == nil || !res.TokenWarned[i]) {
			taken = append(taken, c.toks[i])
			taken[len(taken)-1].held = res.TokenLevels[i]
		}
	}
	*buf = taken
	h := &Hold{l: l, store: res.Backend, shared: res.Shared, charges: taken, at: now.UnixNano(), overage: p.overage, cachedWeight: p.cachedWeight, price: p.price(id.Model), buf: buf, slots: slots}
	if id.Key != nil {
		h.key = id.Key.Name
	}
	h.record(Reserved)
	dec.Hold = h
	return dec, nil
}

// recordDurable counts a request refused because a durable bucket could not be held.
func (l *Limiter) recordDurable(c *charges) {
	for _, group := range [2][]Charge{c.reqs, c.toks} {
		for i := range group {
			if group[i].Durable {
				l.rec.DurableRefused(group[i].Key.Dim)
				return
			}
		}
	}
}

// tightest keeps in s the bucket with the least remaining.
func tightest(s *Status, c Charge, level float64, now time.Time) {
	if s.Present && float64(s.Remaining) <= math.Floor(level) {
		return
	}
	*s = status(c, level, now)
}

// recordSkipped counts the buckets a full map admitted without charge, under the
// limits' labels and by dimension and kind.
func (l *Limiter) recordSkipped(charges []Charge, skipped []bool) {
	for i, s := range skipped {
		if !s {
			continue
		}
		k := charges[i].Key
		switch k.Kind {
		case Requests:
			l.rec.Skipped("request_rate")
		case TokensDay:
			l.rec.Skipped("token_budget_day")
		default:
			l.rec.Skipped("token_budget")
		}
		l.rec.BucketMapFull(k.Dim, k.Kind)
	}
}

// recordRules counts each rule window's decision: admitted, warned, or refused for
// the one at index refused.
func (l *Limiter) recordRules(charges []Charge, warned []bool, refused int) {
	for i := range charges {
		ch := &charges[i]
		if ch.Key.Rule == "" {
			continue
		}
		o := RuleAdmitted
		switch {
		case i == refused:
			o = RuleRefused
		case refused >= 0:
			continue
		case warned != nil && warned[i]:
			o = RuleWarned
		}
		l.stats(ch.ctr).Decision(o)
	}
}

// recordLevels publishes the level of each rule bucket a request drew on, as the
// store reported it after the reservation or after the overage its settlement
// charged (the fleet's for a shared store; a refund's is recordRefunded's). A rule
// fanned out by subject reports the bucket of the last request it decided or
// settled: one series per rule window, never one per subject. A level the store did
// not know (NaN) is not published.
func (l *Limiter) recordLevels(charges []Charge, levels []float64, skipped []bool, view func(Charge) Charge) {
	for i := range charges {
		ch := &charges[i]
		if ch.Key.Rule == "" || i >= len(levels) || (skipped != nil && skipped[i]) || math.IsNaN(levels[i]) {
			continue
		}
		l.recordLevel(ch, view(*ch), levels[i])
	}
}

// recordLevel publishes a rule bucket's level; v is the charge as its store decided
// it.
func (l *Limiter) recordLevel(ch *Charge, v Charge, level float64) {
	if !(v.Capacity > 0) {
		return
	}
	var end time.Time
	if ch.Key.Kind == Calendar {
		end = time.UnixMilli(ch.EndMillis)
	}
	l.stats(ch.ctr).Level((v.Capacity-level)/v.Capacity, v.Capacity, ch.ctr.amount, end)
}

// stats is a rule counter's recorder, resolved once per policy.
func (l *Limiter) stats(c *counter) RuleRecorder {
	if s := c.stats.Load(); s != nil {
		return s.r
	}
	s := &ruleStats{r: l.rec.Rule(c.rule, c.name)}
	c.stats.Store(s)
	return s.r
}

// refusal describes a store's refusal. Of the buckets beyond request counts, one
// smaller than what the request reserves on it is named in preference to the first
// that refused: waiting cannot cure it, and the caller should hear that rather than a
// time to wait.
func (l *Limiter) refusal(c *charges, res *Result, now time.Time, view func(Charge) Charge) *Refusal {
	r := &Refusal{RetryAfter: res.RetryAfter}
	var ch *Charge
	var level float64
	if res.RefusedBy == Requests {
		r.Requests = true
		ch, level = &c.reqs[res.Refused], res.RequestLevels[res.Refused]
		l.recordRules(c.reqs, nil, res.Refused)
		if ch.Key.Rule == "" {
			l.rec.RequestRefusal(ch.Key.Dim)
		}
	} else {
		i := res.Refused
		for j := range c.toks {
			if !res.TokenSkipped[j] && !c.toks[j].Warn && c.toks[j].Amount > view(c.toks[j]).Capacity {
				i, r.LargerThanBucket = j, true
				break
			}
		}
		ch, level = &c.toks[i], res.TokenLevels[i]
		l.recordRules(c.toks, nil, i)
		if ch.Key.Rule == "" {
			l.rec.TokenRefusal(ch.Key.Dim, ch.Key.Kind)
		}
	}
	ctr := ch.ctr
	r.Dimension, r.Period, r.BothPeriods = ch.Key.Dim, ch.Key.Kind, ctr.both
	r.Rule, r.Window, r.Amount, r.Scoped, r.Asked = ch.Key.Rule, ctr.name, ctr.amount, ctr.scoped, ch.Amount
	r.WindowIndex = ch.Key.Window
	if ctr.scoped {
		v := view(*ch)
		if ctr.amount == AmountCost {
			r.Cost = Dollars{Present: true, Limit: v.Capacity, Remaining: max(level, 0), Reset: reset(v, level, now)}
		} else {
			r.Bucket = status(v, level, now)
		}
	}
	return r
}

// status reports a bucket for the headers. A bucket in debt has nothing remaining,
// and is whole again only once it has repaid the debt and refilled. Every number
// saturates rather than wraps.
func status(c Charge, level float64, now time.Time) Status {
	return Status{Present: true, Limit: saturatedInt(c.Capacity), Remaining: saturatedInt(math.Floor(level)), Reset: reset(c, level, now)}
}

// reset is when a bucket is whole again: a calendar window at its end.
func reset(c Charge, level float64, now time.Time) time.Time {
	switch {
	case c.Key.Kind == Calendar:
		return time.UnixMilli(c.EndMillis)
	case c.Rate > 0 && level < c.Capacity:
		return now.Add(Seconds((c.Capacity - level) / c.Rate))
	}
	return now
}

// Hold is one admitted request's reservation. Exactly one of Settle or Release takes
// effect; later calls do nothing, so every path may call Release on its way out.
type Hold struct {
	l *Limiter
	// store holds the reservation; charges are its buckets, each with the amount it
	// took. shared is Result.Shared: the store decided on the charges' shared
	// parameters.
	store   Store
	charges []Charge
	// at is when the reservation was taken, on the limiter's clock (Unix
	// nanoseconds).
	at           int64
	key          string
	cachedWeight float64
	price        *config.Price
	// buf is the pooled backing of charges, returned once the hold is settled or
	// released; nil when the charges are not pooled.
	buf    *[]Charge
	done   atomic.Bool
	shared bool
	// overage is the rule in force when the hold was taken.
	overage Overage
	// slots are the in-flight slots the request holds, given back when it settles
	// or is released, on the request's goroutine; nil: none.
	slots SlotHold
}

// endSlots gives the hold's slots back: the request ended. It reports whether the
// hold holds nothing else.
func (h *Hold) endSlots() bool {
	if h.slots != nil {
		h.l.endSlots(h.slots)
	}
	return len(h.charges) == 0
}

// used is what a request consumed in one counter's units.
func (h *Hold) used(a Amount, u Used) float64 {
	cached := float64(min(max(u.Cached, 0), u.Input))
	input := float64(u.Input)
	if cached > 0 && h.cachedWeight != 1 {
		input += (h.cachedWeight - 1) * cached
	}
	switch a {
	case AmountTokens:
		if input == float64(u.Input) {
			// In integers first, as the reservation was: a total the floats would round.
			return float64(u.Input + u.Output)
		}
		return input + float64(u.Output)
	case AmountInput:
		return input
	case AmountOutput:
		return float64(u.Output)
	case AmountCost:
		return dollars(h.price, u)
	}
	return 0
}

// Costs reports whether a cost budget governs the held request: one of its buckets
// counts dollars, and is enforced (a warn rule's is not). A nil hold has none.
func (h *Hold) Costs() bool {
	if h == nil {
		return false
	}
	for i := range h.charges {
		if c := &h.charges[i]; !c.Warn && c.ctr != nil && c.ctr.amount == AmountCost {
			return true
		}
	}
	return false
}

// Settle replaces the reservation with the usage the backend reported, bucket by
// bucket in each bucket's units: the unused part is refunded; an overage is charged,
// and a bucket that cannot cover it goes into debt (at most one capacity below zero)
// or, under overage: forgive, gives nothing.
func (h *Hold) Settle(u Used) bool { return h.SettleTo(u, nil) }

// SettleTo is Settle, telling to what the settlement did once the store has done it:
// before SettleTo returns on a store in memory, and on a store that makes a network
// call when the settlement only refunds and the store sends refunds without waiting
// (RefundSender); otherwise later and on another goroutine. to may be nil; it is not
// called when SettleTo returns false.
func (h *Hold) SettleTo(u Used, to SettleReceiver) bool {
	if h == nil || !h.done.CompareAndSwap(false, true) {
		return false
	}
	if h.endSlots() {
		if to != nil {
			to.Settled(Settlement{})
		}
		return true
	}
	back, over := h.split(u)
	if h.l.async && (len(over) > 0 || !h.sends()) {
		// A charge waits for the store's answer: off the request's goroutine.
		h.l.pending.Go(func() { h.settle(back, over, to) })
	} else {
		h.settle(back, over, to)
	}
	return true
}

// split makes the hold's charges the settlement's: the refunds first, each with the
// amount it returns, then the overages, each with the amount it takes (in floats: a
// usage the backend reported can be anything an int64 holds).
func (h *Hold) split(u Used) (back, over []Charge) {
	refunds := 0
	for i := range h.charges {
		ch := &h.charges[i]
		ch.Amount -= h.used(ch.ctr.amount, u)
		if ch.Amount > 0 {
			h.charges[refunds], h.charges[i] = h.charges[i], h.charges[refunds]
			refunds++
		}
	}
	back, over = h.charges[:refunds], h.charges[refunds:]
	over = slices.DeleteFunc(over, func(c Charge) bool { return c.Amount == 0 })
	for i := range over {
		over[i].Amount = -over[i].Amount
	}
	return back, over
}

// sends tells whether the hold's store sends refunds without waiting for them.
func (h *Hold) sends() bool {
	_, ok := h.store.(RefundSender)
	return ok
}

// refund returns charges to the hold's store: sent without waiting, and counted
// pending until applied, on a store that sends refunds and a limiter that settles
// off the request's goroutine.
func (h *Hold) refund(charges []Charge) {
	if rs, ok := h.store.(RefundSender); ok && h.l.async {
		rs.SendRefund(charges, &h.l.pending)
		return
	}
	h.store.Refund(context.Background(), charges)
}

// settle does the work of Settle, on the request's goroutine or off it.
func (h *Hold) settle(back, over []Charge, to SettleReceiver) {
	var done Settlement
	if len(back) > 0 {
		h.refund(back)
		h.recordEach(Refunded, back, nil)
		h.recordRefunded(back)
	}
	if len(over) > 0 {
		taken, debt, levels := h.store.Charge(context.Background(), over, h.overage)
		h.recordEach(Charged, over, taken)
		h.l.recordLevels(over, levels, nil, h.view)
		done.add(over, debt)
	}
	h.recycle()
	if to != nil {
		to.Settled(done)
	}
}

// view is a charge as the hold's store decided it: on the shared parameters when a
// shared store did.
func (h *Hold) view(ch Charge) Charge {
	if h.shared {
		return ch.Shared()
	}
	return ch
}

// Release returns the whole reservation: the request failed, was cut, or reported no
// usage.
func (h *Hold) Release() bool {
	if h == nil || !h.done.CompareAndSwap(false, true) {
		return false
	}
	if h.endSlots() {
		return true
	}
	if h.l.async && !h.sends() {
		h.l.pending.Go(h.release)
	} else {
		h.release()
	}
	return true
}

// release does the work of Release, on the request's goroutine or off it.
func (h *Hold) release() {
	h.refund(h.charges)
	h.record(Refunded)
	h.recordRefunded(h.charges)
	h.recycle()
}

// recordRefunded publishes the level of each rule bucket charges were refunded to:
// its level after the reservation, refilled since, with the refund back, up to its
// capacity. A refund sent without waiting has no answer to read a level from; what
// other requests did to the bucket meanwhile is seen at the next decision.
func (h *Hold) recordRefunded(charges []Charge) {
	elapsed := -1.0
	for i := range charges {
		ch := &charges[i]
		if ch.Key.Rule == "" || math.IsNaN(ch.held) {
			continue
		}
		if elapsed < 0 {
			elapsed = max(float64(h.l.clock.Now().UnixNano()-h.at)/1e9, 0)
		}
		v := h.view(*ch)
		h.l.recordLevel(ch, v, min(v.Capacity, ch.held+v.Rate*elapsed+ch.Amount))
	}
}

// recycle returns pooled charges once the hold is done with them.
func (h *Hold) recycle() {
	if h.buf == nil {
		return
	}
	heldPool.Put(h.buf)
	h.buf, h.charges = nil, nil
}

// Wait waits until every settlement and release running off the request goroutines
// is done, or ctx ends. A stopping proxy calls it once no request is in flight.
func (l *Limiter) Wait(ctx context.Context) error {
	done := make(chan struct{})
	go func() {
		l.pending.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// record counts each bucket's amount of outcome.
func (h *Hold) record(o Outcome) { h.recordEach(o, h.charges, nil) }

// recordEach counts what each bucket took (taken, or else its charge's amount): the
// limits' token buckets per period, once per dimension (the most any of its periods
// took), and once for the key (the most any bucket took); the rules' per rule
// window. A bucket that took nothing is not counted.
func (h *Hold) recordEach(o Outcome, charges []Charge, taken []float64) {
	var perDim [NumDimensions]float64
	most := 0.0
	for i := range charges {
		c := &charges[i]
		n := c.Amount
		if taken != nil {
			n = taken[i]
		}
		if !(n > 0) {
			continue
		}
		if c.Key.Rule != "" {
			h.l.stats(c.ctr).Amount(o, n)
			continue
		}
		h.l.rec.PeriodTokens(c.Key.Dim, c.Key.Kind, o, n)
		perDim[c.Key.Dim] = max(perDim[c.Key.Dim], n)
		most = max(most, n)
	}
	for d, n := range perDim {
		if n > 0 {
			h.l.rec.DimensionTokens(Dimension(d), o, n)
		}
	}
	if h.key != "" && most > 0 {
		h.l.rec.KeyTokens(h.key, o, most)
	}
}

// NopRecorder discards every record.
type NopRecorder struct{}

// DimensionTokens implements Recorder.
func (NopRecorder) DimensionTokens(Dimension, Outcome, float64) {}

// PeriodTokens implements Recorder.
func (NopRecorder) PeriodTokens(Dimension, Kind, Outcome, float64) {}

// TokenRefusal implements Recorder.
func (NopRecorder) TokenRefusal(Dimension, Kind) {}

// RequestRefusal implements Recorder.
func (NopRecorder) RequestRefusal(Dimension) {}

// Skipped implements Recorder.
func (NopRecorder) Skipped(string) {}

// BucketMapFull implements Recorder.
func (NopRecorder) BucketMapFull(Dimension, Kind) {}

// KeyTokens implements Recorder.
func (NopRecorder) KeyTokens(string, Outcome, float64) {}

// RedisUnavailable implements Recorder.
func (NopRecorder) RedisUnavailable(Dimension, string) {}

// RedisPipeline implements Recorder.
func (NopRecorder) RedisPipeline(time.Duration, int, int, int) {}

// Rule implements Recorder.
func (NopRecorder) Rule(string, string) RuleRecorder { return nopRule{} }

// DurableRefused implements Recorder.
func (NopRecorder) DurableRefused(Dimension) {}

type nopRule struct{}

func (nopRule) Decision(RuleOutcome)    {}
func (nopRule) Amount(Outcome, float64) {}
func (nopRule) Overflowed()             {}

func (nopRule) Level(float64, float64, Amount, time.Time) {}
