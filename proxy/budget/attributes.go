// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package budget

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/tokenwarden/tokenwarden/proxy/config"
)

// Attr is a request attribute a rule selects on (applies_when) or counts by
// (count_by): a dimension other than global, or one of the attributes beyond them.
type Attr uint8

// The attributes: the dimensions' values first (Attr(d) is dimension d's), then the
// others.
const (
	AttrClient = Attr(Client)
	AttrAPIKey = Attr(APIKey)
	AttrUser   = Attr(User)
	AttrTeam   = Attr(Team)
	AttrModel  = Attr(Model)
	AttrTenant = Attr(Tenant)
)

// The attributes beyond the dimensions.
const (
	AttrProvider Attr = Attr(NumDimensions) + iota
	AttrEndpoint
	AttrEnvironment
	AttrSession
	AttrAgent
	AttrTask
	AttrRun
	AttrFingerprint
	// NumAttrs is also a counter's "no count_by".
	NumAttrs
)

var attrNames = [NumAttrs]string{
	"global", "client", "api_key", "user", "team", "model", "tenant",
	"provider", "endpoint", "environment", "session", "agent", "task", "run", "request_fingerprint",
}

var configAttrs = map[config.RuleDimension]Attr{
	config.RuleClient: AttrClient, config.RuleAPIKey: AttrAPIKey, config.RuleUser: AttrUser, config.RuleTeam: AttrTeam,
	config.RuleModel: AttrModel, config.RuleTenant: AttrTenant, config.RuleProvider: AttrProvider,
	config.RuleEndpoint: AttrEndpoint, config.RuleEnvironment: AttrEnvironment, config.RuleSession: AttrSession,
	config.RuleAgent: AttrAgent, config.RuleTask: AttrTask, config.RuleRun: AttrRun, config.RuleFingerprint: AttrFingerprint,
}

// String is the attribute as rules name it.
func (a Attr) String() string {
	if a < NumAttrs {
		return attrNames[a]
	}
	return "unknown"
}

// Supplied reports whether the client chooses the value (a header, or the body for
// the fingerprint): it is counted under the key that sent it, and bounded.
func (a Attr) Supplied() bool { return a >= AttrSession && a < NumAttrs }

// Dimension is the attribute's dimension; false for an attribute beyond them.
func (a Attr) Dimension() (Dimension, bool) {
	if a >= AttrClient && a < Attr(NumDimensions) {
		return Dimension(a), true
	}
	return 0, false
}

// Attrs is a set of attributes, as a bit mask.
type Attrs uint16

// Has reports whether a is in the set.
func (s Attrs) Has(a Attr) bool { return s&(1<<a) != 0 }

// Overflow is the count_by value of the requests whose client-supplied value came
// beyond the bound of distinct values of its key and window: they share one counter.
// It holds a space, which no header value does.
const Overflow = "(beyond max_attribute_values)"

// isOverflow reports whether a counter's By is an overflow subject's: Overflow, or
// KEY/Overflow under a subject other than the key.
func isOverflow(by string) bool {
	return by == Overflow || strings.HasSuffix(by, "/"+Overflow)
}

// overflowOf is the By of the overflow subject of a client-supplied value's counter:
// Overflow under the key itself, KEY/Overflow under another subject (a key's name
// holds no '/', so the first one ends it).
func overflowOf(k Key) string {
	key, _, _ := strings.Cut(k.By, "/")
	return overflowBy(k.Dim, key)
}

// overflowBy is the By of key's overflow subject under a subject of dimension d.
func overflowBy(d Dimension, key string) string {
	if d == APIKey {
		return Overflow
	}
	return key + "/" + Overflow
}

// selector is one attribute of a rule's applies_when: the request's value must be one
// of values.
type selector struct {
	attr   Attr
	values set
}

// matches reports whether the identity holds one of the selector's values. A
// provider selector matches the serving upstream's provider family or its name.
func (s *selector) matches(id *Identity) bool {
	if s.attr == AttrProvider && id.Provider != "" && s.values.has(id.Provider) {
		return true
	}
	v := id.attr(s.attr)
	return (v != "" || s.attr.Supplied()) && s.values.has(v)
}

// selectorsOf compiles a rule's applies_when, model apart (it joins models).
func selectorsOf(r *config.Rule) []selector {
	var out []selector
	for a, vs := range r.AppliesWhen {
		if a == config.RuleModel {
			continue
		}
		out = append(out, selector{attr: configAttrs[a], values: setOf(vs)})
	}
	slices.SortFunc(out, func(x, y selector) int { return int(x.attr) - int(y.attr) })
	return out
}

// ValueAsk is one client-supplied count_by value a reservation would count: the
// store admits it among the at most Limit distinct values of its set (a rule window
// and a key) in the epoch that holds the present, or marks it Over.
type ValueAsk struct {
	// Rule and Window name the counter; Key is the API key the value is counted
	// under ("" for anonymous traffic).
	Rule   string
	Window uint8
	Key    string
	// Value is the client's value.
	Value string
	// Limit is how many distinct values the set holds per epoch.
	Limit int64
	// Epoch is the set's window: a rolling window's period; a calendar window's
	// start (Start, Unix seconds) names its epoch instead.
	Epoch time.Duration
	Start int64
	// TTL is how long a shared store keeps the set: past its epoch's end.
	TTL time.Duration
	// Over is set by the store: the value came beyond Limit and is counted in the
	// overflow subject.
	Over bool
}

// ValueBounder is a store that bounds, where its counters live, the distinct
// client-supplied values they are counted by.
type ValueBounder interface {
	// BoundValues sets each ask's Over. An error means the store could not decide.
	BoundValues(ctx context.Context, asks []ValueAsk) error
}

// EpochOf is the epoch of an ask at now, in units of its Epoch (or its Start).
func (a *ValueAsk) EpochOf(now time.Time) int64 {
	if a.Epoch <= 0 {
		return a.Start
	}
	return now.UnixMilli() / a.Epoch.Milliseconds()
}

// selects reports whether every applies_when selector of the counter matches.
func (c *counter) selects(id *Identity) bool {
	for i := range c.when {
		if !c.when[i].matches(id) {
			return false
		}
	}
	return true
}

// whenKey spells the counter's selectors for its group: a rule that selects
// differently never replaces another.
func (c *counter) whenKey() string {
	if len(c.when) == 0 {
		return ""
	}
	var b strings.Builder
	for _, s := range c.when {
		fmt.Fprintf(&b, "%s=%q;", s.attr, s.values.sorted())
	}
	return b.String()
}

// Reads are the attributes the policy's rules select on or count by beyond the
// dimensions: what a request must be read for (its headers, its fingerprint).
func (p *Policy) Reads() Attrs { return p.reads }

// readsOf are the attributes beyond the dimensions a rule uses.
func readsOf(r *config.Rule) Attrs {
	var s Attrs
	for a := range r.AppliesWhen {
		s |= 1 << configAttrs[a]
	}
	if r.CountBy != "" {
		s |= 1 << configAttrs[r.CountBy]
	}
	return s
}

// valueSets are the Memory store's sets of distinct client-supplied values, one per
// rule window and key, each holding the values of one epoch.
type valueSets struct {
	mu sync.Mutex
	m  map[valueSetKey]*valueSet
}

type valueSetKey struct {
	rule   string
	window uint8
	key    string
}

type valueSet struct {
	epoch int64
	seen  map[string]struct{}
}

// BoundValues implements ValueBounder: a value seen in its set's epoch, or one more
// while the set holds fewer than its limit, is admitted; any other is Over.
func (m *Memory) BoundValues(_ context.Context, asks []ValueAsk) error {
	now := m.clock.Now()
	vs := &m.values
	vs.mu.Lock()
	defer vs.mu.Unlock()
	if vs.m == nil {
		vs.m = map[valueSetKey]*valueSet{}
	}
	full := m.valueCount.Load() >= m.maxBuckets.Load()
	for i := range asks {
		a := &asks[i]
		k := valueSetKey{rule: a.Rule, window: a.Window, key: a.Key}
		s := vs.m[k]
		if s == nil {
			s = &valueSet{seen: map[string]struct{}{}}
			vs.m[k] = s
		}
		if e := a.EpochOf(now); e != s.epoch {
			s.epoch = e
			clear(s.seen)
		}
		if _, ok := s.seen[a.Value]; ok {
			continue
		}
		// A full map of values' buckets takes no new value either: it counts in its
		// key's overflow subject, as one beyond the key's bound does.
		if int64(len(s.seen)) >= a.Limit || full {
			a.Over = true
			continue
		}
		s.seen[a.Value] = struct{}{}
	}
	return nil
}

// ValuesHeld is how many distinct values the Memory store holds for a rule window
// and key in its present epoch.
func (m *Memory) ValuesHeld(rule string, window uint8, key string) int {
	m.values.mu.Lock()
	defer m.values.mu.Unlock()
	if s := m.values.m[valueSetKey{rule: rule, window: window, key: key}]; s != nil {
		return len(s.seen)
	}
	return 0
}

// PeekValues implements ValuePeeker: an ask is Over when its set, in the present
// epoch, holds Limit values and not this one.
func (m *Memory) PeekValues(_ context.Context, asks []ValueAsk) error {
	now := m.clock.Now()
	vs := &m.values
	vs.mu.Lock()
	defer vs.mu.Unlock()
	full := m.valueCount.Load() >= m.maxBuckets.Load()
	for i := range asks {
		a := &asks[i]
		s := vs.m[valueSetKey{rule: a.Rule, window: a.Window, key: a.Key}]
		if s == nil || s.epoch != a.EpochOf(now) {
			a.Over = a.Limit <= 0 || full
			continue
		}
		_, seen := s.seen[a.Value]
		a.Over = !seen && (int64(len(s.seen)) >= a.Limit || full)
	}
	return nil
}
