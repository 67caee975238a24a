// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package redisagents

import (
	"context"
	"encoding/binary"
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
)

// slotsTakeScript takes one slot ARGV[3] of every key of KEYS, all or nothing, each
// within its limit ARGV[3+k]; slots whose lease ended are dropped. ARGV: now, the
// lease (ms), the slot's id, the limits. It returns 0 taken, or the index (from 1)
// of the key at its limit. The keys are the in-flight slots of rules, stored as an
// API key's (scripts.go), so renewScript renews them.
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
  if #live >= tonumber(ARGV[3 + k]) then return k end
  lives[k] = live
end
for k = 1, #KEYS do
  local live = lives[k]
  live[#live + 1] = ARGV[3] .. pack('<d', now + lease)
  call('PSETEX', KEYS[k], 2 * lease, '\1' .. table.concat(live))
end
return 0
`)

// slotsEndScript gives back the slot ARGV[1] of every key of KEYS, keeping their TTL.
var slotsEndScript = redis.NewScript(`#!lua
local sub = string.sub
for k = 1, #KEYS do
  local raw = redis.call('GET', KEYS[k])
  if raw then
    local live = {}
    for i = 2, #raw - 19, 20 do
      if sub(raw, i, i + 11) ~= ARGV[1] then live[#live + 1] = sub(raw, i, i + 19) end
    end
    redis.call('SET', KEYS[k], '\1' .. table.concat(live), 'KEEPTTL')
  end
end
return 0
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

// slotCall is the keys of one slot group a request holds slots of.
type slotCall struct {
	group string
	keys  []string
}

// TakeSlots implements budget.Slots: one script call per slot group (on one server,
// one), all or nothing; a group that refuses gives back what the groups before it
// took.
func (f *Fleet) TakeSlots(ctx context.Context, asks []budget.SlotAsk) (budget.SlotHold, int, error) {
	if time.Now().UnixNano() < f.downUntil.Load() {
		return nil, -1, errDown
	}
	h := &slotHold{f: f, slot: string(binary.BigEndian.AppendUint32(f.id[:], f.seq.Add(1)))}
	at := make([][]int, 0, 1)
	for i := range asks {
		g, k := f.slotKey(asks[i].Key)
		j := 0
		for j < len(h.calls) && h.calls[j].group != g {
			j++
		}
		if j == len(h.calls) {
			h.calls = append(h.calls, slotCall{group: g})
			at = append(at, nil)
		}
		h.calls[j].keys = append(h.calls[j].keys, k)
		at[j] = append(at[j], i)
	}
	for j := range h.calls {
		c := &h.calls[j]
		args := make([]any, 0, 3+len(c.keys))
		args = append(args, f.now(), f.lease.Milliseconds(), h.slot)
		for _, i := range at[j] {
			args = append(args, asks[i].Limit)
		}
		refused, err := f.run(ctx, slotsTakeScript, c.keys, args...).Int64()
		if err != nil || refused != 0 {
			h.calls = h.calls[:j]
			h.End()
			if err != nil {
				f.failed(err)
				return nil, -1, err
			}
			return nil, at[j][refused-1], nil
		}
		for _, k := range c.keys {
			f.holding(k)
		}
	}
	return h, -1, nil
}

// Shared implements budget.Slots: the counts are the fleet's.
func (f *Fleet) Shared() bool { return true }

// slotHold is the slots one request holds: its slot id in each key of calls.
type slotHold struct {
	f     *Fleet
	slot  string
	calls []slotCall
	done  bool
}

// End implements budget.SlotHold: one script call per slot group, before the
// request's handler returns. While Redis is unreachable the slots' lease ends them.
func (h *slotHold) End() {
	if h.done {
		return
	}
	h.done = true
	f := h.f
	for _, c := range h.calls {
		for _, k := range c.keys {
			f.release(k)
		}
		if time.Now().UnixNano() < f.downUntil.Load() {
			continue
		}
		if err := f.run(context.Background(), slotsEndScript, c.keys, h.slot).Err(); err != nil && !errors.Is(err, redis.Nil) {
			f.failed(err)
			f.log.Warn("Could not give back a request's slots in flight; their lease ends them", "error", err)
		}
	}
}
