-- nanobucket: a batch of GCRA decisions, one per key in KEYS, in order, at
-- one reading of the clock (see _redis_gcra.lua for the units and the math).
-- For a single Redis only: a Cluster rejects keys of different slots in one
-- script, so there nanobucket/redis.py pipelines _redis_gcra.lua instead.
--
-- ARGV[1] interval_us, ARGV[2] tau_us, ARGV[3] cost, ARGV[4] now_us or '',
-- ARGV[5] extra ms of TTL for explicit times.
-- returns a string of one byte per key: 1 admitted, 0 refused
-- A key that does not hold a bucket counts as an empty one and is replaced
-- by one (see _redis_gcra.lua).
local interval = tonumber(ARGV[1])
local tau = tonumber(ARGV[2])
local cost_t = tonumber(ARGV[3]) * interval
local now
local slack = 0
if ARGV[4] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
else
  now = tonumber(ARGV[4])
  slack = tonumber(ARGV[5])
end
local out = {}
for i, key in ipairs(KEYS) do
  local raw = redis.pcall('GET', key)
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
  if base - now <= tau - cost_t then
    out[i] = '\1'
    if cost_t > 0 then
      tat = base + cost_t
      bad = true  -- write it
    end
  else
    out[i] = '\0'
  end
  if bad then
    local ttl = math.floor((tat - now) / 1000) + 1 + slack
    redis.call('SET', key, string.format('%.0f', tat), 'PX', string.format('%.0f', ttl))
  end
end
return table.concat(out)
