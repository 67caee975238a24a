// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package redisstore

import "github.com/redis/go-redis/v9"

// Storage. One key per dimension and id holds that id's three buckets (request count,
// minute and day) as one 104-byte string, struct.pack("<ddddddddddddd"): four numbers
// per slot in budget.Kind order, level, last_ms, capacity and rate (units per second),
// then the expiry the key was given (Unix milliseconds on the Redis clock; a rule's
// counter keeps the 96-byte layout without it, which earlier versions read). A level
// below zero is a debt (an overage the bucket could not cover), at most one capacity.
// A slot whose capacity is -1 is absent, and an absent slot or key is a full bucket,
// so every key expires about when its slowest bucket is full again, debt included
// (within half a second of a second after), and an idle key disappears. A write whose
// key already expires within that half second keeps the TTL (SET ... KEEPTTL) instead
// of setting one (PSETEX), which costs Redis about half as much. The scripts still
// read the 96-byte layout written before the expiry was stored (the twelve numbers
// alone), and give such a key a TTL at its next write. Six dimensions on both periods
// plus request limits are at most six keys, so a reservation is one MGET and at most
// six writes in one round trip.
//
// Time. The scripts read the Redis server's clock (TIME) for every refill and TTL:
// last_ms is always Redis time, so replicas whose clocks disagree never credit their
// skew as refill. Redis 7 replicates a script's effects, not the script, so a script
// may read TIME and still write.
//
// Calls. Buckets are given in a spec, 27 bytes per bucket,
// struct.pack("<HBddd"): the index of the bucket's key in KEYS (1-based), its slot,
// and three numbers that depend on the script. A binary spec keeps a call to a few
// arguments: Redis parses, and Lua converts, one value instead of five per bucket.

// specSize is the bytes of one bucket in a spec; decideSpecSize of one bucket in a
// reservation's spec, which adds the flags and the amount.
const (
	specSize       = 27
	decideSpecSize = 36
)

// bucketLib is the code both scripts share: reading every key of the call, and writing
// one back with the TTL its slowest bucket needs. The "#!lua" line (Redis 7) makes
// Redis refuse a script that may write before it starts when Redis is out of memory,
// instead of failing at the first write with the writes before it made: a decision is
// applied whole or not at all.
const bucketLib = `#!lua
local call, pack, unpackb, ceil = redis.call, struct.pack, struct.unpack, math.ceil
local FMT, FMT96, find = '<ddddddddddddd', '<dddddddddddd', string.find
local now
do
  local t = call('TIME')
  now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
end
-- stored[k] is key k's twelve bucket numbers, then (13) the expiry the key was given,
-- in Redis milliseconds (0 when unknown: a key of the 96-byte layout, or none).
local stored = {}
local fetched = call('MGET', unpack(KEYS))
do
  local vals = fetched
  for k = 1, #KEYS do
    local v = vals[k]
    local s
    if v and #v == 104 then
      s = {unpackb(FMT, v)}
    elseif v and #v == 96 then
      s = {unpackb(FMT96, v)}
      s[13] = 0
    else
      s = {0, 0, -1, 0, 0, 0, -1, 0, 0, 0, -1, 0, 0}
    end
    stored[k] = s
  end
end
local dirty = {}
local function flush()
  for k = 1, #KEYS do
    if dirty[k] then
      local s = stored[k]
      local ttl = 1
      for b = 0, 8, 4 do
        local c, r = s[b + 3], s[b + 4]
        if c >= 0 then
          local need = 1000
          if r > 0 then need = ceil((c - s[b + 1]) / r * 1000) + 1000 end
          need = need - (now - s[b + 2])
          if need > ttl then ttl = need end
        end
      end
      -- A value this script did not write must not make the TTL invalid (not a
      -- number, or too large to print as an integer).
      if not (ttl < 1e13) then ttl = 1e13 end
      local key = KEYS[k]
      if find(key, '}:rule:', 1, true) then
        -- A rule's counter keeps the 96-byte layout, which every version reads: a
        -- durable counter must never read as full.
        call('PSETEX', key, ceil(ttl), pack(FMT96, unpack(s, 1, 12)))
      else
        -- The key keeps the expiry it has while that is within half a second of the
        -- one it needs: a SET that keeps the TTL costs Redis about half a PSETEX.
        -- Otherwise it expires half a second after it needs, so that the next
        -- writes, whose need moves with the clock, keep it for a while.
        local want = now + ttl
        local e = s[13]
        if e >= want - 500 and e <= want + 500 then
          call('SET', key, pack(FMT, unpack(s, 1, 13)), 'KEEPTTL')
        else
          ttl = ceil(ttl + 500)
          s[13] = now + ttl
          call('PSETEX', key, ttl, pack(FMT, unpack(s, 1, 13)))
        end
      end
    end
  end
end
`

// The apply script returns refunds and then decides reservations, one after the other
// in the order given, each all or nothing: request-count buckets first (a refusal
// takes nothing), then the other buckets (a refusal takes only the request-count
// buckets). It reads every key once, and writes back once each key that changed.
//
// A refund returns each bucket's amount up to its capacity; a bucket that is absent
// is full, with nothing to return. An amount recorded under other parameters than the
// bucket's current ones is scaled to them, so a hold taken before a reload settles on
// what it recorded.
//
// A calendar window's counter is a bucket that never refills (rate 0) and starts
// full at its window's start (each window is its own key); its last_ms holds the
// window's end, later than now, so nothing refills it and its TTL lasts until the
// window ends. A warn bucket that cannot cover its amount takes nothing and refuses
// nothing; the reply marks it.
//
// A decision with a durable bucket (flag 4: a calendar window or a cost amount that
// refuses) is checked against the trust fence: when the call names an epoch (ARGV[2])
// that the group's epoch key (the last of KEYS) does not hold, it takes nothing and is
// refused with kind 2, its warned value carrying the epoch found ("" when none).
//
// ARGV: the refunds' spec, with the capacity and rate recorded on the hold and the
// amount for every bucket (empty when there are none); the epoch expected ("" when no
// reservation of the call has a durable bucket); the reservations' sum by bucket, in
// the decide spec's layout with the sum as the amount (empty when the call offers
// none; see batch.go). Then the reservations: with a sum, in its terms, all in one
// value: for each, nreq (its first nreq buckets are request-count buckets) and its
// number of buckets, then for each bucket its index in the sum (1-based) and the
// amount it takes, about a third of a decide spec (Redis and Lua read, and Lua
// hashes, every byte of an argument). Without a sum, two values per reservation:
// nreq and its decide spec, 36 bytes per bucket, struct.pack("<HBBdddd"): key index,
// slot, flags (1 warn, 2 calendar, 4 durable), capacity, rate, period_ms (the wait
// reported for a zero allowance, which never refills; for a calendar window its end
// in Unix milliseconds), and the amount it takes.
// Returns one decision per reservation: {admitted (1/0), refused index (1-based
// within its kind, 0 when admitted), refused kind (0 requests, 1 the others),
// retry_after_ms (at most 2^53), levels, warned, now_ms} (refused kind 2: fenced) where levels packs each
// bucket's level after the decision as a little-endian double, warned is one byte
// per bucket ("1" for a warn bucket the request did not fit) or empty when none, and
// now_ms is the Redis server's clock. A bucket in debt repays it before it holds
// anything: its wait includes the debt. A calendar window's wait is the time to its
// end. When every bucket of the sum held it, the reply is instead {levels before,
// now_ms}: each distinct bucket's level before the reservations took from it, packed
// as little-endian doubles in the sum's order, every reservation admitted.
var applyScript = redis.NewScript(bucketLib + `
do
  local spec = ARGV[1]
  local pos = 1
  for i = 1, #spec / 27 do
    local k, slot, hc, hr, x
    k, slot, hc, hr, x, pos = unpackb('<HBddd', spec, pos)
    local b = 4 * slot
    local s = stored[k]
    local c = s[b + 3]
    if c >= 0 then
      local l, r = s[b + 1], s[b + 4]
      local dt = (now - s[b + 2]) / 1000
      if dt > 0 then l = l + dt * r end
      if hc > 0 and c ~= hc then x = x * c / hc end
      l = l + x
      if l > c then l = c end
      s[b + 1] = l
      if s[b + 2] < now then s[b + 2] = now end
      dirty[k] = true
    end
  end
end

-- The trust fence: a call that decides a durable bucket names the epoch its replica
-- runs under in ARGV[2] and the group's epoch key last in KEYS (read by the MGET above
-- with the buckets: no command of its own). An epoch absent or other is lost state.
local trusted, found = true, ''
if ARGV[2] ~= '' then
  local e = fetched[#KEYS]
  if e ~= ARGV[2] then
    trusted = false
    if e then found = e end
  end
end

local key, base, level, cap, rate, period, amt, flg = {}, {}, {}, {}, {}, {}, {}, {}
-- warned is nil until a warn bucket of the decision does not fit; then one '0' or '1'
-- per bucket.
local warned, n

-- check finds the first bucket in first..last that cannot give its amount and may
-- refuse, the longest wait any of them needs, and marks the warn buckets that cannot.
local function check(first, last)
  local refused, retry = 0, 0
  for i = first, last do
    local l, c, r, need = level[i], cap[i], rate[i], amt[i]
    if need > c or l < need then
      local f = flg[i]
      if f % 2 == 1 then
        if not warned then
          warned = {}
          for j = 1, n do warned[j] = '0' end
        end
        warned[i] = '1'
      else
        if refused == 0 then refused = i - first + 1 end
        local w
        if f % 4 >= 2 then w = period[i] - now
        elseif r <= 0 then w = period[i]
        elseif need > c then
          local debt = 0
          if l < 0 then debt = -l end
          w = (need + debt) / r * 1000
        else w = (need - l) / r * 1000 end
        if w > retry then retry = w end
      end
    end
  end
  return refused, retry
end

local function take(first, last)
  for i = first, last do
    if not (warned and warned[i] == '1') then
      local s, b, l = stored[key[i]], base[i], level[i] - amt[i]
      level[i] = l
      local t = now
      if flg[i] % 4 >= 2 then t = period[i] end
      s[b + 1], s[b + 2], s[b + 3], s[b + 4] = l, t, cap[i], rate[i]
      dirty[key[i]] = true
    end
  end
end

-- levelNow is a bucket's level now under the parameters given (refilled, and scaled
-- when they changed since it was written).
local function levelNow(s, b, f, c, r)
  local oc = s[b + 3]
  if oc < 0 then return c end
  local l, orate = s[b + 1], s[b + 4]
  local dt = (now - s[b + 2]) / 1000
  if dt > 0 then
    l = l + dt * orate
    if l > oc then l = oc end
  end
  if oc ~= c or orate ~= r then
    if f % 4 >= 2 then l = l + c - oc
    elseif oc > 0 then l = l / oc * c
    else l = c end
  end
  return l
end
-- decide decides the reservation whose n buckets are loaded in key..flg, the first
-- nreq of them request-count buckets.
local function decide(nreq, nb)
  n, warned = nb, nil
  -- fits stays true while every bucket holds its amount: then nothing needs checking.
  local fits = true
  for i = 1, n do
    local a, c = amt[i], cap[i]
    local l = levelNow(stored[key[i]], base[i], flg[i], c, rate[i])
    level[i] = l
    if a > c or l < a then fits = false end
  end
  if not trusted then
    for i = 1, n do
      if flg[i] >= 4 then
        return {0, 0, 2, 0, pack('<' .. string.rep('d', n), unpack(level, 1, n)), found, now - now % 1}
      end
    end
  end
  if fits then
    take(1, n)
    return {1, 0, 0, 0, pack('<' .. string.rep('d', n), unpack(level, 1, n)), '', now - now % 1}
  end
  local admitted, kind = 0, 0
  local refused, retry = check(1, nreq)
  if refused == 0 then
    take(1, nreq)
    kind = 1
    refused, retry = check(nreq + 1, n)
    if refused == 0 then
      take(nreq + 1, n)
      admitted, kind = 1, 0
    end
  end
  -- A wait too long for an integer reply saturates (the store saturates it again to
  -- the longest Duration).
  if not (retry < 9007199254740992) then retry = 9007199254740992 end
  local w = ''
  if warned then w = table.concat(warned, '', 1, n) end
  return {admitted, refused, kind, ceil(retry), pack('<' .. string.rep('d', n), unpack(level, 1, n)), w, now - now % 1}
end

-- The sum by bucket (ARGV[3], see batch.go): when every bucket holds what all the
-- reservations take from it, take it at once and return each bucket's level before.
-- Nothing is written unless every bucket holds its sum.
local sum = ARGV[3]
local m = #sum / 36
if m > 0 and trusted then
  -- A first pass checks every bucket; only when all hold their sum does a second take
  -- them. The sum is read twice rather than kept in tables, which cost more to grow.
  local lv, pos, all = {}, 1, true
  for i = 1, m do
    local k, slot, f, c, r, p, a
    k, slot, f, c, r, p, a, pos = unpackb('<HBBdddd', sum, pos)
    local l = levelNow(stored[k], 4 * slot, f, c, r)
    -- The margin covers the rounding of taking the amounts one by one.
    if not (l - a >= 1e-12 * (math.abs(l) + a)) then
      all = false
      break
    end
    lv[i] = l
  end
  if all then
    pos = 1
    for i = 1, m do
      local k, slot, f, c, r, p, a
      k, slot, f, c, r, p, a, pos = unpackb('<HBBdddd', sum, pos)
      local s, b, t = stored[k], 4 * slot, now
      if f % 4 >= 2 then t = p end
      s[b + 1], s[b + 2], s[b + 3], s[b + 4] = lv[i] - a, t, c, r
      dirty[k] = true
    end
    flush()
    return {pack('<' .. string.rep('d', m), unpack(lv, 1, m)), now - now % 1}
  end
end

-- The sum's buckets, for the reservations given in its terms.
local sk, sb, sf, sc, sr, sp = {}, {}, {}, {}, {}, {}
do
  local pos = 1
  for i = 1, m do
    local slot, a
    sk[i], slot, sf[i], sc[i], sr[i], sp[i], a, pos = unpackb('<HBBdddd', sum, pos)
    sb[i] = 4 * slot
  end
end

local out = {}
if m > 0 then
  -- The reservations in the sum's terms (ARGV[4]): for each, nreq and its number of
  -- buckets, struct.pack("<HH"), then per bucket its index in the sum and its
  -- amount, struct.pack("<Hd").
  local rs, pos = ARGV[4], 1
  while pos <= #rs do
    local nreq, nb
    nreq, nb, pos = unpackb('<HH', rs, pos)
    for i = 1, nb do
      local j, a
      j, a, pos = unpackb('<Hd', rs, pos)
      key[i], base[i], flg[i], cap[i], rate[i], period[i], amt[i] = sk[j], sb[j], sf[j], sc[j], sr[j], sp[j], a
    end
    out[#out + 1] = decide(nreq, nb)
  end
else
  for a = 4, #ARGV, 2 do
    local spec, pos = ARGV[a + 1], 1
    local nb = #spec / 36
    for i = 1, nb do
      local k, slot
      k, slot, flg[i], cap[i], rate[i], period[i], amt[i], pos = unpackb('<HBBdddd', spec, pos)
      key[i], base[i] = k, 4 * slot
    end
    out[#out + 1] = decide(tonumber(ARGV[a]), nb)
  end
end
flush()
return out
`)

// The charge script takes an overage: each bucket's amount if it holds it (an absent
// bucket is full). One that does not hold it goes into debt, down to minus its
// capacity, when ARGV[2] is "debt", and gives nothing otherwise (forgive). A calendar
// window's counter (recorded with a capacity above 0 and a rate of 0) records the
// whole overage, whatever ARGV[2] says, and keeps its window's end. An amount
// recorded under other parameters than the bucket's current ones is scaled to them,
// and what the bucket gave is scaled back.
//
// ARGV: spec with the capacity and rate recorded on the hold and the amount, for every
// bucket; the overage rule ("debt" or "forgive").
// Returns what each bucket gave, then what of it went below zero (the debt it took
// on), then each bucket's level after the charge, in the hold's units, packed as 3n
// little-endian doubles.
var chargeScript = redis.NewScript(bucketLib + chargeBody)

// The replay script is the charge script behind a mark: the last key, which a replay
// of the ledger fallback's spend sets (for ARGV[3] milliseconds) in the call that
// charges. A replay sent again after a lost answer finds it, charges nothing and
// returns "replayed". KEYS: the buckets', then the mark's.
var replayScript = redis.NewScript(bucketLib + `
if fetched[#KEYS] then return 'replayed' end
call('SET', KEYS[#KEYS], '1', 'PX', ARGV[3])
` + chargeBody)

// chargeBody is the charge script's own code, after bucketLib.
const chargeBody = `
local spec = ARGV[1]
local debt = ARGV[2] == 'debt'
local n = #spec / 27
local out = {}
local pos = 1
for i = 1, n do
  local k, slot, hc, hr, x
  k, slot, hc, hr, x, pos = unpackb('<HBddd', spec, pos)
  local b = 4 * slot
  local s = stored[k]
  local l, c, r
  if s[b + 3] >= 0 then
    l, c, r = s[b + 1], s[b + 3], s[b + 4]
    local dt = (now - s[b + 2]) / 1000
    if dt > 0 then
      l = l + dt * r
      if l > c then l = c end
    end
  else
    l, c, r = hc, hc, hr
  end
  local scale = 1
  if hc > 0 and c ~= hc and c > 0 then scale = c / hc end
  if hc > 0 and c ~= hc then x = x * c / hc end
  local after = l
  if l >= x or (hc > 0 and hr == 0) then after = l - x
  elseif debt and l > -c then
    after = l - x
    if after < -c then after = -c end
  end
  out[i] = (l - after) / scale
  out[n + i] = math.max(0, math.min(l, 0) - after) / scale
  out[2 * n + i] = after / scale
  if after ~= l then
    local t = s[b + 2]
    if not (s[b + 3] >= 0 and t > now) then t = now end
    s[b + 1], s[b + 2], s[b + 3], s[b + 4] = after, t, c, r
    dirty[k] = true
  end
end
flush()
return pack('<' .. string.rep('d', 3 * n), unpack(out, 1, 3 * n))
`

// The epoch script gives a slot group an epoch when it has none, and returns the one
// it holds: "<created ms on the Redis clock>-<random>".
// KEYS: the group's epoch key. ARGV: the random part of a new epoch.
var epochScript = redis.NewScript(`
local e = redis.call('GET', KEYS[1])
if not e then
  local t = redis.call('TIME')
  e = (tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)) .. '-' .. ARGV[1]
  redis.call('SET', KEYS[1], e)
end
return e
`)

// The stamp script gives a slot group the fleet's epoch when it holds none, and
// returns the one it holds. KEYS: the group's epoch key. ARGV: the epoch.
var stampScript = redis.NewScript(`
local e = redis.call('GET', KEYS[1])
if not e then
  e = ARGV[1]
  redis.call('SET', KEYS[1], e)
end
return e
`)

// The attest script restores durable counters and then writes a new epoch, in one
// atomic call: after it, the counters hold what was attested and the fence trusts
// them. Each counter gets slot 0 of its key (a rule's counter has a key of its own):
// level capacity minus spent (at most one capacity below zero for a rolling window,
// which carries debt), refilling from now, or for a calendar window (end_ms above 0)
// never refilling, until its window's end.
// KEYS: the counters' keys, then the group's epoch key. ARGV: the random part of the
// new epoch; a spec of 32 bytes per counter, struct.pack("<dddd"): capacity, rate,
// end_ms, spent; the epoch to write ("" or absent: a new one, drawn here; on a
// cluster the other slot groups are given the one group 0 drew). Returns the epoch.
var attestScript = redis.NewScript(`#!lua
local call, pack, ceil = redis.call, struct.pack, math.ceil
local t = call('TIME')
local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
local spec, pos = ARGV[2], 1
for k = 1, #KEYS - 1 do
  local c, r, e, x
  c, r, e, x, pos = struct.unpack('<dddd', spec, pos)
  local l, last, ttl = c - x, now, 1000
  if e > 0 then
    last, ttl = e, e - now + 1000
  else
    if l < -c then l = -c end
    if r > 0 then ttl = ceil((c - l) / r * 1000) + 1000 end
  end
  if ttl < 1 then ttl = 1 end
  call('PSETEX', KEYS[k], ceil(ttl), pack('<dddddddddddd', l, last, c, r, 0, 0, -1, 0, 0, 0, -1, 0))
end
local e = ARGV[3]
if not e or e == '' then e = (now - now % 1) .. '-' .. ARGV[1] end
call('SET', KEYS[#KEYS], e)
return e
`)
