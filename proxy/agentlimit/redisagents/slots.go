// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package redisagents

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
)

// slotsTakeScript takes one slot ARGV[3] of every key of KEYS, all or nothing, each
// within its limit ARGV[3+k]; slots whose lease ended are dropped. ARGV: now, the
// lease (ms), the slot's id, the limits. It returns {0, the slots of each key} taken,
// or {the index (from 1) of the key at its limit, its slots}. The keys are the
// in-flight slots of rules, stored as an API key's (scripts.go), so renewScript
// renews them.
var slotsTakeScript = redis.NewScript(clockLib + `
local lease = tonumber(ARGV[2])
local lives = {}
for k = 1, #KEYS do
  local live = {}
  local raw = call('GET', KEYS[k])
  if raw then
    for i = 2, #raw - 19, 20 do
      if unpackb('<d', raw, i + 12) > now then live[#live + 1] = sub(raw, i, i + 19) end
    end
  end
  if #live >= tonumber(ARGV[3 + k]) then return {k, #live} end
  lives[k] = live
end
local out = {0}
for k = 1, #KEYS do
  local live = lives[k]
  live[#live + 1] = ARGV[3] .. pack('<d', now + lease)
  call('PSETEX', KEYS[k], 2 * lease, '\1' .. table.concat(live))
  out[k + 1] = #live
end
return out
`)

// slotsEndScript gives back the slot ARGV[2] of every key of KEYS, keeping their TTL.
// ARGV[1] is now. It returns the slots in flight left in each key.
var slotsEndScript = redis.NewScript(clockLib + `
local out = {}
for k = 1, #KEYS do
  local raw = call('GET', KEYS[k])
  local n = 0
  if raw then
    local kept = {}
    for i = 2, #raw - 19, 20 do
      if sub(raw, i, i + 11) ~= ARGV[2] then
        kept[#kept + 1] = sub(raw, i, i + 19)
        if unpackb('<d', raw, i + 12) > now then n = n + 1 end
      end
    end
    call('SET', KEYS[k], '\1' .. table.concat(kept), 'KEEPTTL')
  end
  out[k] = n
end
return out
`)

// slotsPeekScript counts the slots in flight of every key of KEYS, taking nothing.
// ARGV[1] is now.
var slotsPeekScript = redis.NewScript(clockLib + `
local out = {}
for k = 1, #KEYS do
  local raw = call('GET', KEYS[k])
  local n = 0
  if raw then
    for i = 2, #raw - 19, 20 do
      if unpackb('<d', raw, i + 12) > now then n = n + 1 end
    end
  end
  out[k] = n
end
return out
`)

// slotKey is the Redis key of an in-flight window's slots, in its subject's slot
// group: the admission's, so a fleet on one server or one group takes them in one call.
func (f *Fleet) slotKey(k budget.Key) (group, key string) {
	p := f.store.SubjectPrefix(budget.Key{Dim: k.Dim, ID: k.ID, Tenant: k.Tenant})
	var b strings.Builder
	b.Grow(len(p) + len(k.Rule) + len(k.Tenant) + len(k.ID) + len(k.By) + 48)
	b.WriteString(p)
	b.WriteString("agents:rule:")
	for _, s := range [...]string{k.Rule, strconv.Itoa(int(k.Window)), k.Tenant, k.Dim.String(), k.ID, k.By} {
		b.WriteString(strconv.Itoa(len(s)))
		b.WriteByte(':')
		b.WriteString(s)
		b.WriteByte(':')
	}
	return p, b.String()
}

// slotCall is the keys of one slot group a request holds slots of, and the index of
// each one's ask.
type slotCall struct {
	group string
	keys  []string
	at    []int
}

// groups sorts the asks' keys by slot group, in the order the asks first name them.
func (f *Fleet) groups(asks []budget.SlotAsk) []slotCall {
	calls := make([]slotCall, 0, 1)
	for i := range asks {
		g, k := f.slotKey(asks[i].Key)
		j := 0
		for j < len(calls) && calls[j].group != g {
			j++
		}
		if j == len(calls) {
			calls = append(calls, slotCall{group: g})
		}
		calls[j].keys = append(calls[j].keys, k)
		calls[j].at = append(calls[j].at, i)
	}
	return calls
}

// TakeSlots implements budget.Slots: one script call per slot group (on one server,
// one), all or nothing; a group that refuses gives back what the groups before it
// took.
func (f *Fleet) TakeSlots(ctx context.Context, asks []budget.SlotAsk) (budget.SlotHold, int, error) {
	if time.Now().UnixNano() < f.downUntil.Load() {
		return nil, -1, errDown
	}
	h := &slotHold{f: f, slot: string(binary.BigEndian.AppendUint32(f.id[:], f.seq.Add(1))), asks: slices.Clone(asks)}
	h.calls = f.groups(asks)
	for j := range h.calls {
		c := &h.calls[j]
		args := make([]any, 0, 3+len(c.keys))
		args = append(args, f.now(), f.lease.Milliseconds(), h.slot)
		for _, i := range c.at {
			args = append(args, asks[i].Limit)
		}
		res, err := f.run(ctx, slotsTakeScript, c.keys, args...).Int64Slice()
		if err == nil && len(res) < 2 {
			err = errors.New("redis: the slots' take script answered nothing")
		}
		if err != nil || res[0] != 0 {
			h.calls = h.calls[:j]
			h.End()
			if err != nil {
				f.failed(err)
				return nil, -1, err
			}
			i := c.at[res[0]-1]
			asks[i].Held = res[1]
			return nil, i, nil
		}
		for k, i := range c.at {
			if k+1 < len(res) {
				asks[i].Held, h.asks[i].Held = res[k+1], res[k+1]
			}
		}
		for _, k := range c.keys {
			f.holding(k)
		}
	}
	return h, -1, nil
}

// PeekSlots implements budget.SlotPeeker: each ask's slots in flight in the fleet,
// one script call per slot group, taking nothing.
func (f *Fleet) PeekSlots(ctx context.Context, asks []budget.SlotAsk) error {
	if time.Now().UnixNano() < f.downUntil.Load() {
		return errDown
	}
	for _, c := range f.groups(asks) {
		res, err := f.run(ctx, slotsPeekScript, c.keys, f.now()).Int64Slice()
		if err != nil {
			f.failed(err)
			return fmt.Errorf("count the slots in flight: %w", err)
		}
		for k, i := range c.at {
			if k < len(res) {
				asks[i].Held = res[k]
			}
		}
	}
	return nil
}

// Shared implements budget.Slots: the counts are the fleet's.
func (f *Fleet) Shared() bool { return true }

// slotHold is the slots one request holds: its slot id in each key of calls, taken
// for asks.
type slotHold struct {
	f     *Fleet
	slot  string
	calls []slotCall
	asks  []budget.SlotAsk
	done  bool
}

// End implements budget.SlotHold: one script call per slot group, before the
// request's handler returns. While Redis is unreachable the slots' lease ends them.
func (h *slotHold) End() []budget.SlotAsk {
	if h.done {
		return nil
	}
	h.done = true
	f := h.f
	for i := range h.asks {
		h.asks[i].Held = -1
	}
	for _, c := range h.calls {
		for _, k := range c.keys {
			f.release(k)
		}
		if time.Now().UnixNano() < f.downUntil.Load() {
			continue
		}
		res, err := f.run(context.Background(), slotsEndScript, c.keys, f.now(), h.slot).Int64Slice()
		if err != nil && !errors.Is(err, redis.Nil) {
			f.failed(err)
			f.log.Warn("Could not give back a request's slots in flight; their lease ends them", "error", err)
			continue
		}
		for k, i := range c.at {
			if k < len(res) {
				h.asks[i].Held = res[k]
			}
		}
	}
	return h.asks
}
