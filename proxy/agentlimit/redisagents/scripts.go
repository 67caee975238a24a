// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package redisagents

import "github.com/redis/go-redis/v9"

// Storage. An API key's slots in flight are one string: a byte 1, then 20 bytes a
// slot, its 12-byte id (the replica's 8 random bytes and a 4-byte count) and its lease's
// expiry, struct.pack("<d") in milliseconds. A run is a byte 2 and its steps and tokens
// (spent and still reserved), struct.pack("<Bdd"), kept for the run's idle time after
// its last step. Neither length is a bucket's (96 or 104 bytes), so the usage scan
// passes them by, and strings need no command the fleet's Redis user lacks.
//
// Time. now is ARGV[1] in milliseconds, or the Redis server's clock (TIME) when it is
// 0, so that replicas whose clocks disagree agree on when a lease ends.

// clockLib reads the present.
const clockLib = `#!lua
local call, pack, unpackb, sub = redis.call, struct.pack, struct.unpack, string.sub
local now = tonumber(ARGV[1])
if now == 0 then
  local t = call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
`

// takeScript takes a slot of KEYS[1] (when ARGV[3], the limit, is above 0) and a step
// and ARGV[8] tokens of the run KEYS[2] (when ARGV[5] is 1), all or nothing; slots
// whose lease ended are dropped. ARGV: now, the lease (ms), the limit, the slot's id,
// the run flag, the run's steps and tokens (0: no bound), the cost, the run's idle time
// (ms). It returns {0} admitted, {1, slots} at the limit, {2 or 3, steps, tokens} for
// the run's steps or tokens.
var takeScript = redis.NewScript(clockLib + `
local lease, limit = tonumber(ARGV[2]), tonumber(ARGV[3])
local live = {}
if limit > 0 then
  local raw = call('GET', KEYS[1])
  if raw then
    for i = 2, #raw - 19, 20 do
      if unpackb('<d', raw, i + 12) > now then live[#live + 1] = sub(raw, i, i + 19) end
    end
  end
  if #live >= limit then return {1, #live, 0} end
end
if ARGV[5] == '1' then
  local raw = call('GET', KEYS[2])
  local steps, spent = 0, 0
  if raw and #raw == 17 then steps, spent = unpackb('<dd', raw, 2) end
  local maxSteps, maxTokens, cost = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
  local refused = 0
  if maxSteps > 0 and steps >= maxSteps then
    refused = 2
  elseif maxTokens > 0 and spent + cost > maxTokens then
    refused = 3
  end
  if refused > 0 then
    -- A refused run is seen: it stays as long as its agent keeps sending.
    if raw then call('PSETEX', KEYS[2], ARGV[9], raw) end
    return {refused, steps, spent}
  end
  call('PSETEX', KEYS[2], ARGV[9], pack('<Bdd', 2, steps + 1, spent + cost))
end
if limit > 0 then
  live[#live + 1] = ARGV[4] .. pack('<d', now + lease)
  call('PSETEX', KEYS[1], 2 * lease, '\1' .. table.concat(live))
end
return {0}
`)

// endScript gives back what a request took: its slot ARGV[1] of KEYS[1] ("" none),
// and, when ARGV[2] is 1, its run KEYS[2]'s reservation ARGV[3] corrected to ARGV[4]
// used, and its step too when ARGV[5] is 1 (it ran nothing). A run forgotten since is
// left forgotten. Both keep their TTL.
var endScript = redis.NewScript(`#!lua
local call, pack, unpackb, sub = redis.call, struct.pack, struct.unpack, string.sub
if ARGV[1] ~= '' then
  local raw = call('GET', KEYS[1])
  if raw then
    local live = {}
    for i = 2, #raw - 19, 20 do
      if sub(raw, i, i + 11) ~= ARGV[1] then live[#live + 1] = sub(raw, i, i + 19) end
    end
    call('SET', KEYS[1], '\1' .. table.concat(live), 'KEEPTTL')
  end
end
if ARGV[2] == '1' then
  local raw = call('GET', KEYS[2])
  if raw and #raw == 17 then
    local steps, spent = unpackb('<dd', raw, 2)
    spent = math.max(spent - tonumber(ARGV[3]) + tonumber(ARGV[4]), 0)
    if ARGV[5] == '1' then steps = math.max(steps - 1, 0) end
    call('SET', KEYS[2], pack('<Bdd', 2, steps, spent), 'KEEPTTL')
  end
end
return 0
`)

// renewScript renews the leases of the slots of KEYS[1] whose id starts with ARGV[3],
// the replica's 8 bytes, to ARGV[2] ms from now, and drops those of others whose lease
// ended. ARGV: now, the lease, the replica. It returns the slots renewed.
var renewScript = redis.NewScript(clockLib + `
local lease = tonumber(ARGV[2])
local raw = call('GET', KEYS[1])
if not raw then return 0 end
local live, n = {}, 0
for i = 2, #raw - 19, 20 do
  local rec = sub(raw, i, i + 19)
  if sub(rec, 1, 8) == ARGV[3] then
    live[#live + 1] = sub(rec, 1, 12) .. pack('<d', now + lease)
    n = n + 1
  elseif unpackb('<d', rec, 13) > now then
    live[#live + 1] = rec
  end
end
call('PSETEX', KEYS[1], 2 * lease, '\1' .. table.concat(live))
return n
`)
