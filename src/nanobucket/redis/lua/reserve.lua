-- nanobucket: reserve tokens on one key, possibly past empty (see
-- nanobucket/redis.py, acquire). Same state and units as _redis_gcra.lua:
-- tat in microseconds, every value below 2^53. A reservation is a place in
-- line: the tat moves past "empty" and every later caller sees it owed.
--
-- KEYS[1]  the bucket
-- ARGV[1]  tau_us        capacity * interval_us
-- ARGV[2]  cost_us       cost * interval_us
-- ARGV[3]  now_us, or '' to read the server's clock (TIME)
-- ARGV[4]  max_wait_us   reserve nothing when the wait would be longer
-- ARGV[5]  '1' shape (due at the start of its slot), '0' due when the tokens exist
-- ARGV[6]  extra ms of TTL for explicit times
-- returns the us to wait before the tokens may be used, or -1 (nothing reserved)
-- A key that does not hold a bucket counts as an empty one (see _redis_gcra.lua).
local tau = tonumber(ARGV[1])
local cost_t = tonumber(ARGV[2])
local now
local slack = 0
if ARGV[3] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
else
  now = tonumber(ARGV[3])
  slack = tonumber(ARGV[6])
end
local raw = redis.pcall('GET', KEYS[1])
local tat = now
if raw then
  tat = tonumber(raw)
  if not (tat and tat >= 0 and tat <= 9007199254740991) then tat = now + tau end
end
local base = tat
if now > base then base = now end
local lead = tau
if ARGV[5] == '1' then lead = cost_t end
local wait = base - now - (lead - cost_t)
if wait < 0 then wait = 0 end
if wait > tonumber(ARGV[4]) or base + cost_t > 9007199254740991 then return -1 end
if cost_t > 0 then
  tat = base + cost_t
  local ttl = math.floor((tat - now) / 1000) + 1 + slack
  redis.call('SET', KEYS[1], string.format('%.0f', tat), 'PX', string.format('%.0f', ttl))
end
return wait
