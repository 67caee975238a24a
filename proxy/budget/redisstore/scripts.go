// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package redisstore

import "github.com/redis/go-redis/v9"

// A bucket is one string value: struct.pack("<dddd", level, last_ms, capacity, rate),
// rate in units per second. An absent key is a full bucket, so every write sets a TTL
// of the time the bucket needs to refill, and an idle bucket disappears.
//
// The reserve script reads every key of the request with one MGET, decides, and
// writes each changed bucket with one SET ... PX: 1 + N commands for N buckets, all
// or nothing, in one round trip.
//
// KEYS: the request-count buckets, then the token buckets.
// ARGV: now_ms, nreq, amount, then capacity, rate and period_ms for every key (the
// period is the wait reported for a zero allowance, which never refills).
// Returns: {admitted (1/0), refused index (1-based, 0 when admitted), refused kind
// (0 requests, 1 tokens), retry_after_ms, level_1, ..., level_N} with each level after
// the operation in thousandths of a token (integers; a negative level is not possible).
var reserveScript = redis.NewScript(`
local call, pack, unpackb, min, ceil = redis.call, struct.pack, struct.unpack, math.min, math.ceil
local now = tonumber(ARGV[1])
local nreq = tonumber(ARGV[2])
local amount = tonumber(ARGV[3])
local n = #KEYS
local vals = call('MGET', unpack(KEYS))
local level, cap, rate, period = {}, {}, {}, {}
for i = 1, n do
  local c = tonumber(ARGV[1 + 3 * i])
  local r = tonumber(ARGV[2 + 3 * i])
  cap[i], rate[i], period[i] = c, r, tonumber(ARGV[3 + 3 * i])
  local v = vals[i]
  if v then
    local l, t, oc, orate = unpackb('<dddd', v)
    local dt = (now - t) / 1000
    if dt > 0 then l = min(oc, l + dt * orate) end
    if oc ~= c or orate ~= r then
      if oc > 0 then l = l / oc * c else l = c end
    end
    level[i] = l
  else
    level[i] = c
  end
end

local function wait(i, need)
  if rate[i] <= 0 then return period[i] end
  if need > cap[i] then return need / rate[i] * 1000 end
  local w = (need - level[i]) / rate[i] * 1000
  if w < 0 then return 0 end
  return w
end

local function write(i)
  local ttl = 1000
  if rate[i] > 0 then ttl = ceil((cap[i] - level[i]) / rate[i] * 1000) + 1000 end
  call('PSETEX', KEYS[i], ttl, pack('<dddd', level[i], now, cap[i], rate[i]))
end

-- Levels go back as integer thousandths: a Lua number reply is truncated to an integer.
local function levels(out)
  local k = #out
  for i = 1, n do out[k + i] = level[i] * 1000 end
  return out
end

local refused, retry = 0, 0
for i = 1, nreq do
  if 1 > cap[i] or level[i] < 1 then
    if refused == 0 then refused = i end
    local w = wait(i, 1)
    if w > retry then retry = w end
  end
end
if refused > 0 then return levels({0, refused, 0, ceil(retry)}) end
for i = 1, nreq do level[i] = level[i] - 1 end

for i = nreq + 1, n do
  if amount > cap[i] or level[i] < amount then
    if refused == 0 then refused = i - nreq end
    local w = wait(i, amount)
    if w > retry then retry = w end
  end
end
for i = 1, nreq do write(i) end
if refused > 0 then return levels({0, refused, 1, ceil(retry)}) end
for i = nreq + 1, n do
  level[i] = level[i] - amount
  write(i)
end
return levels({1, 0, 0, 0})
`)

// The adjust script settles a hold: a refund returns amount to each bucket up to its
// capacity; a charge takes amount from each bucket that holds it and nothing from one
// that does not. An amount recorded under other parameters than the bucket's current
// ones is scaled to them, so a hold taken before a reload settles on what it recorded.
//
// KEYS: the hold's token buckets. ARGV: now_ms, mode ("refund" or "charge"), amount,
// then the capacity and rate recorded on the hold for every key.
// Returns: one 1/0 per key, whether it was changed.
var adjustScript = redis.NewScript(`
local call, pack, unpackb, min, ceil = redis.call, struct.pack, struct.unpack, math.min, math.ceil
local now = tonumber(ARGV[1])
local charge = ARGV[2] == 'charge'
local amount = tonumber(ARGV[3])
local vals = call('MGET', unpack(KEYS))
local out = {}
for i = 1, #KEYS do
  local hc = tonumber(ARGV[2 + 2 * i])
  local hr = tonumber(ARGV[3 + 2 * i])
  local v = vals[i]
  local l, c, r
  if v then
    local t
    l, t, c, r = unpackb('<dddd', v)
    local dt = (now - t) / 1000
    if dt > 0 then l = min(c, l + dt * r) end
  else
    l, c, r = hc, hc, hr
  end
  local a = amount
  if hc > 0 and c ~= hc then a = amount * c / hc end
  local changed = 0
  if charge then
    if l >= a then l = l - a; changed = 1 end
  elseif v then
    l = min(c, l + a)
    changed = 1
  end
  if changed == 1 then
    local ttl = 1000
    if r > 0 then ttl = ceil((c - l) / r * 1000) + 1000 end
    call('PSETEX', KEYS[i], ttl, pack('<dddd', l, now, c, r))
  end
  out[i] = changed
end
return out
`)
