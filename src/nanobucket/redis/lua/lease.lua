-- lib: clock digits expiry store
-- nanobucket: take or give back a lease of tokens on one key (see
-- LeasedTokenBucket); lib.lua comes first. Same state and units as gcra.lua.
--
-- KEYS[1]  the bucket
-- ARGV[1]  interval_us
-- ARGV[2]  tau_us
-- ARGV[3]  'take' or 'give'
-- ARGV[4]  take: the most tokens wanted; give: tokens given back
-- ARGV[5]  take: the fewest tokens worth granting (else grant none)
-- ARGV[6]  now_us, or '' for the server's clock (TIME)
-- ARGV[7]  extra ms of TTL for explicit times
-- take returns {granted, retry_after_us, reset_after_us}; give returns {given, 0, reset_after_us}
-- A key that does not hold a bucket counts as an empty one and is replaced
-- by one (see read).
local key = KEYS[1]
local interval = tonumber(ARGV[1])
local tau = tonumber(ARGV[2])
local n = tonumber(ARGV[4])
local now, slack = clock(ARGV[6], ARGV[7])
-- use: read
if now > tat then tat = now end  -- a full bucket: no debt
local base = tat
if write then store(key, tat, now, slack) end

if ARGV[3] == 'give' then
  -- Unspent tokens go back, but never past full (tat >= now): the bucket
  -- ends where it would be had they never been taken, or full.
  if tat > now then
    tat = tat - n * interval
    if tat < now then tat = now end
    store(key, tat, now, slack)
  end
  return {n, 0, tat - now}
end

local free = tau - (base - now)
local available = 0
if free > 0 then available = (free - math.fmod(free, interval)) / interval end
local need = tonumber(ARGV[5])
if available < need then
  return {0, base - now - (tau - need * interval), base - now}
end
local grant = n
if available < grant then grant = available end
if grant > 0 then
  tat = base + grant * interval
  store(key, tat, now, slack)
end
return {grant, 0, tat - now}
