-- nanobucket: take or give back a lease of tokens on one key (see
-- nanobucket/redis.py, LeasedTokenBucket). Same state and units as
-- _redis_gcra.lua: tat in microseconds, every value below 2^53.
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
-- by one (see _redis_gcra.lua).
local interval = tonumber(ARGV[1])
local tau = tonumber(ARGV[2])
local n = tonumber(ARGV[4])
local now
local slack = 0
if ARGV[6] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
else
  now = tonumber(ARGV[6])
  slack = tonumber(ARGV[7])
end
local raw = redis.pcall('GET', KEYS[1])
local tat = 0
local bad = false
if raw then
  tat = tonumber(raw)
  if not (tat and tat >= 0 and tat <= 9007199254740991) then
    tat = now + tau
    bad = true
  end
end
local base = tat
if now > base then base = now end

local function store(t)
  if t <= now then
    redis.call('DEL', KEYS[1])  -- full again: a missing key is a full bucket
  else
    local ttl = math.floor((t - now) / 1000) + 1 + slack
    redis.call('SET', KEYS[1], string.format('%.0f', t), 'PX', string.format('%.0f', ttl))
  end
end

if bad then store(tat) end
if ARGV[3] == 'give' then
  -- Unspent tokens go back, but never past full (tat >= now): the bucket
  -- ends where it would be had they never been taken, or full.
  if tat > now then
    tat = tat - n * interval
    if tat < now then tat = now end
    store(tat)
  end
  local debt = tat - now
  if debt < 0 then debt = 0 end
  return {n, 0, debt}
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
  store(tat)
end
local debt = tat - now
if debt < 0 then debt = 0 end
return {grant, 0, debt}
