// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package budget

import (
	"maps"
	"slices"

	"github.com/tokenwarden/tokenwarden/proxy/config"
)

// Policy is one config's limits, resolved: every token allowance divided by the
// replica count, every per-key override applied. It is immutable; a reload builds a
// new one.
type Policy struct {
	// Divisor is the budget division in force.
	Divisor int64
	// overage is what settlement does with an overage a bucket cannot cover.
	overage Overage
	dims    [Model]dimPolicy
	models  map[string]*dimPolicy
	keys    map[string]*KeyPolicy // by name
}

// dimPolicy is one dimension's resolved limits.
type dimPolicy struct {
	limits       config.DimensionLimits // as configured: the fleet totals
	minute, day  Allowance
	reqRate      float64
	reqBurst     float64
	bothPeriods  bool
	configured   bool
	requestLimit bool
}

func newDimPolicy(l config.DimensionLimits, divisor int64) dimPolicy {
	p := dimPolicy{
		limits:      l,
		minute:      Divide(l.TokensPerMinute, divisor),
		day:         Divide(l.TokensPerDay, divisor),
		bothPeriods: l.TokensPerMinute > 0 && l.TokensPerDay > 0,
	}
	p.reqRate, p.reqBurst = requestBucket(l.RequestsPerSecond, l.BurstCapacity)
	p.requestLimit = p.reqRate > 0
	p.configured = p.minute.Limited() || p.day.Limited() || p.requestLimit
	return p
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

// KeyPolicy is one API key: its identity and its resolved per_api_key limits (the
// dimension's defaults with the key's overrides applied).
type KeyPolicy struct {
	Name   string
	User   string
	Team   string
	Bypass bool
	// minute is the key's minute allowance: its divided rate_limit_tokens_per_minute
	// override when set, otherwise per_api_key's.
	minute, day Allowance
	reqRate     float64
	reqBurst    float64
	bothPeriods bool
	// configuredTPM is the minute fleet total the key's allowance comes from.
	configuredTPM int64
}

// NewPolicy resolves a validated config's limits.
func NewPolicy(c *config.Config) *Policy {
	div := c.Divisor()
	l := &c.RateLimiting.Limits
	p := &Policy{Divisor: div, models: map[string]*dimPolicy{}, keys: map[string]*KeyPolicy{}}
	if c.RateLimiting.Overage == config.OverageForgive {
		p.overage = Forgive
	}
	p.dims[Global] = newDimPolicy(l.Global, div)
	p.dims[Client] = newDimPolicy(l.PerClient, div)
	p.dims[APIKey] = newDimPolicy(l.PerAPIKey, div)
	p.dims[User] = newDimPolicy(l.PerUser, div)
	p.dims[Team] = newDimPolicy(l.PerTeam, div)
	for m, ml := range l.PerModel {
		dp := newDimPolicy(ml, div)
		p.models[m] = &dp
	}
	for _, k := range c.APIKeys {
		p.keys[k.Name] = p.newKeyPolicy(k, div)
	}
	return p
}

func (p *Policy) newKeyPolicy(k config.APIKey, div int64) *KeyPolicy {
	d := &p.dims[APIKey]
	kp := &KeyPolicy{Name: k.Name, User: k.User, Team: k.Team, Bypass: k.Bypass, minute: d.minute, day: d.day}
	tpm := d.limits.TokensPerMinute
	if k.RateLimitTokensPerMinute > 0 {
		// Every number written on a resource is a fleet total: the override is divided too.
		tpm = k.RateLimitTokensPerMinute
		kp.minute = Divide(tpm, div)
	}
	kp.configuredTPM = tpm
	kp.bothPeriods = tpm > 0 && d.limits.TokensPerDay > 0
	rps := d.limits.RequestsPerSecond
	if k.RateLimit > 0 {
		rps = k.RateLimit
	}
	burst := d.limits.BurstCapacity
	if k.RateLimitBurst > 0 {
		burst = k.RateLimitBurst
	}
	kp.reqRate, kp.reqBurst = requestBucket(rps, burst)
	return kp
}

// Overage is the rule for an overage a bucket cannot cover.
func (p *Policy) Overage() Overage { return p.overage }

// Key returns the policy of the key with this name.
func (p *Policy) Key(name string) *KeyPolicy { return p.keys[name] }

// Keeps reports whether a bucket still belongs to this policy; a reload drops the
// buckets of dimensions, models and keys that are gone.
func (p *Policy) Keeps(k Key) bool {
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
	var out []Effective
	for d := Global; d < Model; d++ {
		dp := &p.dims[d]
		if !dp.configured {
			continue
		}
		out = append(out, dp.effective(d.String(), ""))
	}
	for _, m := range slices.Sorted(maps.Keys(p.models)) {
		e := p.models[m].effective(Model.String(), m)
		out = append(out, e)
	}
	for _, name := range slices.Sorted(maps.Keys(p.keys)) {
		kp := p.keys[name]
		out = append(out, Effective{
			Dimension: APIKey.String(), Key: name,
			ConfiguredTokensPerMinute: kp.configuredTPM, ConfiguredTokensPerDay: p.dims[APIKey].limits.TokensPerDay,
			TokensPerMinute: allowancePtr(kp.minute), TokensPerDay: allowancePtr(kp.day),
			RequestsPerSecond: kp.reqRate, BurstCapacity: kp.reqBurst,
		})
	}
	return out
}

func (dp *dimPolicy) effective(dim, model string) Effective {
	return Effective{
		Dimension: dim, Model: model,
		ConfiguredTokensPerMinute: dp.limits.TokensPerMinute, ConfiguredTokensPerDay: dp.limits.TokensPerDay,
		TokensPerMinute: allowancePtr(dp.minute), TokensPerDay: allowancePtr(dp.day),
		RequestsPerSecond: dp.reqRate, BurstCapacity: dp.reqBurst,
	}
}
