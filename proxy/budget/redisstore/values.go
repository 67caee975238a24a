// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package redisstore

import (
	"context"
	"strconv"

	"github.com/redis/go-redis/v9"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
)

// valuesScript bounds the distinct client-supplied values of a rule window per key
// and epoch: KEYS are one set per ask, ARGV per ask its value, its limit and the set's
// lifetime in milliseconds. A value the set holds, or one more while it holds fewer
// than its limit, is admitted (1); any other is over (0). A set expires after its
// epoch, so a client's values never outlive it in a noeviction Redis.
var valuesScript = redis.NewScript(`
local out = {}
for i, k in ipairs(KEYS) do
  local v, limit, ttl = ARGV[3*i-2], tonumber(ARGV[3*i-1]), tonumber(ARGV[3*i])
  if redis.call('SISMEMBER', k, v) == 1 then
    out[i] = 1
  elseif redis.call('SCARD', k) < limit then
    redis.call('SADD', k, v)
    if redis.call('PTTL', k) < 0 then redis.call('PEXPIRE', k, ttl) end
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
`)

// peekValuesScript answers as valuesScript would, and adds no value: a value the
// set holds, or any while it holds fewer than its limit, is admitted (1).
var peekValuesScript = redis.NewScript(`
local out = {}
for i, k in ipairs(KEYS) do
  local v, limit = ARGV[3*i-2], tonumber(ARGV[3*i-1])
  if redis.call('SISMEMBER', k, v) == 1 or redis.call('SCARD', k) < limit then
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
`)

// valuesKey is the Redis key of an ask's set of values in its epoch:
// {prefix}:values:RULE:WINDOW:LEN:KEY@EPOCH, where prefix is the SubjectPrefix of its
// API key (valuesSubject), so the set is in that key's slot group.
func valuesKey(prefix string, a *budget.ValueAsk, epoch int64) string {
	return prefix + "values:" + a.Rule + ":" + strconv.Itoa(int(a.Window)) + ":" + strconv.Itoa(len(a.Key)) + ":" + a.Key +
		"@" + strconv.FormatInt(epoch, 10)
}

// valuesSubject is the subject whose slot group holds an ask's values: its API key.
func valuesSubject(a *budget.ValueAsk) budget.Key { return budget.Key{Dim: budget.APIKey, ID: a.Key} }

// BoundValues implements budget.ValueBounder in Redis, where the counters live, so
// the bound is the fleet's: one script call per slot group. While Redis is marked
// down, or when the call fails, the fallback's memory decides; without a fallback
// every value is over (counted in the overflow subject, never unbounded).
func (s *Store) BoundValues(ctx context.Context, asks []budget.ValueAsk) error {
	return s.values(ctx, valuesScript, asks, false)
}

// PeekValues implements budget.ValuePeeker: what BoundValues would answer now, with
// no value added, read where BoundValues decides.
func (s *Store) PeekValues(ctx context.Context, asks []budget.ValueAsk) error {
	return s.values(ctx, peekValuesScript, asks, true)
}

// values runs script over the asks, one call per slot group; peek says no value is
// added, on Redis or on the fallback.
func (s *Store) values(ctx context.Context, script *redis.Script, asks []budget.ValueAsk, peek bool) error {
	fb := s.fallback.Load()
	if s.down() {
		return s.valuesFailed(ctx, fb, asks, peek)
	}
	now, _ := s.CalendarNow()
	// One call per slot group (by its prefix): on one server, one.
	byGroup := map[string][]int{}
	var order []string
	for i := range asks {
		p := s.SubjectPrefix(valuesSubject(&asks[i]))
		if _, ok := byGroup[p]; !ok {
			order = append(order, p)
		}
		byGroup[p] = append(byGroup[p], i)
	}
	for _, p := range order {
		idx := byGroup[p]
		keys := make([]string, len(idx))
		args := make([]any, 0, 3*len(idx))
		for j, i := range idx {
			a := &asks[i]
			keys[j] = valuesKey(p, a, a.EpochOf(now))
			args = append(args, a.Value, a.Limit, max(a.TTL.Milliseconds(), 1))
		}
		out, err := s.runScript(ctx, script, keys, args...).Int64Slice()
		if err != nil || len(out) != len(idx) {
			return s.valuesFailed(ctx, fb, asks, peek)
		}
		for j, i := range idx {
			asks[i].Over = out[j] == 0
		}
	}
	return nil
}

// valuesFailed decides the asks when Redis could not: on the fallback's memory, or
// every one over.
func (s *Store) valuesFailed(ctx context.Context, fb *budget.Memory, asks []budget.ValueAsk, peek bool) error {
	switch {
	case fb != nil && peek:
		return fb.PeekValues(ctx, asks)
	case fb != nil:
		return fb.BoundValues(ctx, asks)
	}
	for i := range asks {
		asks[i].Over = true
	}
	return nil
}
