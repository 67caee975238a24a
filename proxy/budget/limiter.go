// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package budget

import (
	"context"
	"math"
	"sync"
	"sync/atomic"
	"time"
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
}

// Status is one identity-scoped bucket's state for response headers.
type Status struct {
	Present   bool
	Limit     int64
	Remaining int64
	// Reset is when the bucket is whole again.
	Reset time.Time
}

// Refusal says why a request was refused.
type Refusal struct {
	// Requests is true for a request-count refusal, false for a token budget.
	Requests  bool
	Dimension Dimension
	// Period is TokensMinute or TokensDay for a token refusal.
	Period Kind
	// BothPeriods: the refusing dimension has a minute and a day budget, so the
	// refusal names the period (details.token_budget).
	BothPeriods bool
	RetryAfter  time.Duration
	// LargerThanBucket: the request is larger than the whole refusing bucket, so no
	// wait lets it in (RetryAfter is then the time its own cost takes to refill). The
	// refusal names that bucket's dimension and period.
	LargerThanBucket bool
	// Bucket is the refusing bucket's capacity and level, set only for the
	// identity-scoped api_key dimension; a shared dimension never reveals its level.
	Bucket Status
}

// Decision is the outcome of admission.
type Decision struct {
	// Hold is the token reservation to settle or release; nil when nothing was
	// reserved (no token budget applies, or the request was refused).
	Hold *Hold
	// Refusal is non-nil when the request must be refused.
	Refusal *Refusal
	// KeyMinute, KeyDay and KeyRequests are the caller's own api_key buckets, for the
	// x-ratelimit-* headers. Shared dimensions are never reported.
	KeyMinute, KeyDay, KeyRequests Status
}

// Limiter admits requests against a Policy on a Store.
type Limiter struct {
	store Store
	rec   Recorder
	clock Clock
	// async settles on a detached goroutine, for stores that make a network call;
	// pending counts those goroutines, so that a stopping proxy waits for them.
	async   bool
	pending sync.WaitGroup
}

// NewLimiter returns a limiter on store. async settles off the request's goroutine.
func NewLimiter(store Store, rec Recorder, clock Clock, async bool) *Limiter {
	return &Limiter{store: store, rec: rec, clock: clock, async: async}
}

// charges are the buckets a request draws on; fixed arrays keep the hot path free of
// allocations for the common case.
type charges struct {
	reqs    []Charge
	reqDims []Dimension
	toks    []Charge
	both    []bool // per token charge: its dimension has both periods
	reqBuf  [NumDimensions]Charge
	reqDBuf [NumDimensions]Dimension
	tokBuf  [NumDimensions * 2]Charge
	bothBuf [NumDimensions * 2]bool
	keyMin  int // index in toks of the api_key minute bucket, or -1
	keyDay  int
	keyReq  int // index in reqs of the api_key request bucket, or -1
}

func (c *charges) addDim(dim Dimension, id string, minute, day Allowance, rate, burst float64, both, tokens bool) {
	if !tokens {
		minute, day = Unlimited(), Unlimited()
	}
	if rate > 0 {
		if dim == APIKey {
			c.keyReq = len(c.reqs)
		}
		c.reqs = append(c.reqs, Charge{Key: Key{Kind: Requests, Dim: dim, ID: id}, Capacity: burst, Rate: rate, SharedCapacity: burst, SharedRate: rate})
		c.reqDims = append(c.reqDims, dim)
	}
	if minute.Limited() {
		if dim == APIKey {
			c.keyMin = len(c.toks)
		}
		c.toks = append(c.toks, tokenCharge(TokensMinute, dim, id, minute))
		c.both = append(c.both, both)
	}
	if day.Limited() {
		if dim == APIKey {
			c.keyDay = len(c.toks)
		}
		c.toks = append(c.toks, tokenCharge(TokensDay, dim, id, day))
		c.both = append(c.both, both)
	}
}

// collect resolves the buckets of every configured dimension the identity has (the
// token buckets only when tokens is set), and counts the token dimensions skipped for a
// missing identity.
func (l *Limiter) collect(p *Policy, id *Identity, c *charges, tokens bool) {
	c.reqs, c.reqDims, c.toks, c.both = c.reqBuf[:0], c.reqDBuf[:0], c.tokBuf[:0], c.bothBuf[:0]
	c.keyMin, c.keyDay, c.keyReq = -1, -1, -1
	for d := Global; d < Model; d++ {
		dp := &p.dims[d]
		var ident string
		switch d {
		case Global:
		case Client:
			ident = id.Client
		case APIKey:
			if id.Key != nil {
				kp := id.Key
				c.addDim(APIKey, kp.Name, kp.minute, kp.day, kp.reqRate, kp.reqBurst, kp.bothPeriods, tokens)
			} else if dp.configured && tokens {
				l.skip(APIKey, dp)
			}
			continue
		case User:
			if id.Key != nil {
				ident = id.Key.User
			}
		case Team:
			if id.Key != nil {
				ident = id.Key.Team
			}
		}
		if !dp.configured {
			continue
		}
		if d != Global && ident == "" {
			if tokens {
				l.skip(d, dp)
			}
			continue
		}
		c.addDim(d, ident, dp.minute, dp.day, dp.reqRate, dp.reqBurst, dp.bothPeriods, tokens)
	}
	if len(p.models) > 0 {
		if id.Model == "" {
			if tokens {
				l.rec.Skipped("token_budget_model")
			}
		} else if mp := p.models[id.Model]; mp != nil {
			c.addDim(Model, id.Model, mp.minute, mp.day, mp.reqRate, mp.reqBurst, mp.bothPeriods, tokens)
		}
	}
}

func (l *Limiter) skip(d Dimension, dp *dimPolicy) {
	if dp.minute.Limited() || dp.day.Limited() {
		l.rec.Skipped("token_budget_" + d.String())
	}
}

// Admit reserves amount tokens (and one request) on every bucket the identity draws
// on, all or nothing. An amount of 0 (a route that is not charged) takes only the
// request-count buckets. An error means the store could not decide; nothing was taken.
func (l *Limiter) Admit(ctx context.Context, p *Policy, id Identity, amount int64) (Decision, error) {
	var dec Decision
	if id.Exempt || (id.Key != nil && id.Key.Bypass) {
		return dec, nil
	}
	var c charges
	l.collect(p, &id, &c, amount > 0)
	if len(c.reqs) == 0 && len(c.toks) == 0 {
		return dec, nil
	}
	res, err := l.store.Reserve(ctx, &Reservation{Requests: c.reqs, Tokens: c.toks, Amount: amount})
	if err != nil {
		return dec, err
	}
	now := l.clock.Now()
	// A shared store decided on the fleet totals: report those.
	view := func(ch Charge) Charge {
		if res.Shared {
			return ch.Shared()
		}
		return ch
	}
	if c.keyReq >= 0 && !res.RequestSkipped[c.keyReq] {
		dec.KeyRequests = status(view(c.reqs[c.keyReq]), res.RequestLevels[c.keyReq], now)
	}
	if res.Admitted || res.RefusedBy != Requests {
		l.recordSkipped(c.reqs, res.RequestSkipped)
	}
	if !res.Admitted {
		dec.Refusal = l.refusal(&c, &res, float64(amount), now, view)
		return dec, nil
	}
	if c.keyMin >= 0 && !res.TokenSkipped[c.keyMin] {
		dec.KeyMinute = status(view(c.toks[c.keyMin]), res.TokenLevels[c.keyMin], now)
	}
	if c.keyDay >= 0 && !res.TokenSkipped[c.keyDay] {
		dec.KeyDay = status(view(c.toks[c.keyDay]), res.TokenLevels[c.keyDay], now)
	}
	l.recordSkipped(c.toks, res.TokenSkipped)
	taken := make([]Charge, 0, len(c.toks))
	for i, ch := range c.toks {
		if !res.TokenSkipped[i] {
			taken = append(taken, ch)
		}
	}
	if len(taken) == 0 {
		return dec, nil
	}
	h := &Hold{l: l, store: res.Backend, charges: taken, amount: amount, overage: p.overage}
	if id.Key != nil {
		h.key = id.Key.Name
	}
	h.record(Reserved, float64(amount))
	dec.Hold = h
	return dec, nil
}

// recordSkipped counts the buckets a full map admitted without charge, under seed
// 000's labels and by dimension and kind.
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

// refusal describes a store's refusal. Of the token buckets, one smaller than the
// whole request is named in preference to the first that refused: waiting cannot cure
// it, and the caller should hear that rather than a time to wait.
func (l *Limiter) refusal(c *charges, res *Result, amount float64, now time.Time, view func(Charge) Charge) *Refusal {
	r := &Refusal{RetryAfter: res.RetryAfter}
	if res.RefusedBy == Requests {
		r.Requests = true
		r.Dimension = c.reqDims[res.Refused]
		l.rec.RequestRefusal(r.Dimension)
		return r
	}
	i := res.Refused
	for j, ch := range c.toks {
		if !res.TokenSkipped[j] && amount > view(ch).Capacity {
			i, r.LargerThanBucket = j, true
			break
		}
	}
	ch := c.toks[i]
	r.Dimension, r.Period, r.BothPeriods = ch.Key.Dim, ch.Key.Kind, c.both[i]
	if r.Dimension == APIKey {
		r.Bucket = status(view(ch), res.TokenLevels[i], now)
	}
	l.rec.TokenRefusal(r.Dimension, r.Period)
	return r
}

// status reports a bucket for the headers. A bucket in debt has nothing remaining,
// and is whole again only once it has repaid the debt and refilled. Every number
// saturates rather than wraps.
func status(c Charge, level float64, now time.Time) Status {
	s := Status{Present: true, Limit: saturatedInt(c.Capacity), Remaining: saturatedInt(math.Floor(level)), Reset: now}
	if c.Rate > 0 && level < c.Capacity {
		s.Reset = now.Add(Seconds((c.Capacity - level) / c.Rate))
	}
	return s
}

// Hold is one admitted request's token reservation. Exactly one of Settle or Release
// takes effect; later calls do nothing, so every path may call Release on its way out.
type Hold struct {
	l       *Limiter
	store   Store
	charges []Charge
	amount  int64
	key     string
	// overage is the rule in force when the hold was taken.
	overage Overage
	done    atomic.Bool
}

// Settle replaces the reservation with the usage the backend reported: the unused
// part is refunded to every bucket; an overage is charged to every bucket, and one
// that cannot cover it goes into debt (at most one capacity below zero) or, under
// overage: forgive, gives nothing.
func (h *Hold) Settle(used int64) bool {
	if h == nil || !h.done.CompareAndSwap(false, true) {
		return false
	}
	h.run(func() {
		// In floats: a usage the backend reported can be anything an int64 holds.
		delta := float64(h.amount) - float64(used)
		switch {
		case delta > 0:
			h.store.Refund(context.Background(), h.charges, delta)
			h.record(Refunded, delta)
		case delta < 0:
			taken := h.store.Charge(context.Background(), h.charges, -delta, h.overage)
			h.recordTaken(Charged, taken)
		}
	})
	return true
}

// Release returns the whole reservation: the request failed, was cut, or reported no
// usage.
func (h *Hold) Release() bool {
	if h == nil || !h.done.CompareAndSwap(false, true) {
		return false
	}
	h.run(func() {
		h.store.Refund(context.Background(), h.charges, float64(h.amount))
		h.record(Refunded, float64(h.amount))
	})
	return true
}

func (h *Hold) run(fn func()) {
	if h.l.async {
		h.l.pending.Go(fn)
		return
	}
	fn()
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

// record counts n tokens of outcome on every bucket of the hold.
func (h *Hold) record(o Outcome, n float64) {
	var buf [NumDimensions * 2]float64
	each := buf[:0]
	if len(h.charges) > len(buf) {
		each = make([]float64, 0, len(h.charges))
	}
	each = each[:len(h.charges)]
	for i := range each {
		each[i] = n
	}
	h.recordTaken(o, each)
}

// recordTaken counts what each bucket took: per period bucket, once per dimension (the
// most any of its periods took), and once for the key (the most any bucket took). A
// bucket that took nothing is not counted.
func (h *Hold) recordTaken(o Outcome, taken []float64) {
	var perDim [NumDimensions]float64
	most := 0.0
	for i, c := range h.charges {
		n := taken[i]
		if !(n > 0) {
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
