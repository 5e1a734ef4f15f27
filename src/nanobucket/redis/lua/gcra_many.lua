-- nanobucket: a batch of GCRA decisions, one per key in KEYS, in order, at
-- one reading of the clock (see _redis_gcra.lua for the units, the math and
-- why numbers are formatted the way they are).
-- For a single Redis only: a Cluster rejects keys of different slots in one
-- script, so there nanobucket/redis.py pipelines _redis_gcra.lua instead.
--
-- ARGV[1] interval_us, ARGV[2] tau_us, ARGV[3] cost, ARGV[4] now_us or '',
-- ARGV[5] extra ms of TTL for explicit times.
-- returns a string of one byte per key: 1 admitted, 0 refused
-- A key that does not hold a bucket counts as an empty one and is replaced
-- by one (see _redis_gcra.lua).
local fmt, fmod, floor, pcall, call = string.format, math.fmod, math.floor, redis.pcall, redis.call
local interval = tonumber(ARGV[1])
local tau = tonumber(ARGV[2])
local cost_t = ARGV[3] * interval
local room = tau - cost_t
local now
local slack = 0
if ARGV[4] == '' then
  local t = call('TIME')
  now = t[1] * 1000000 + t[2]
else
  now = tonumber(ARGV[4])
  slack = tonumber(ARGV[5])
end
-- A whole number as exact decimal digits where a C long is 32 bits too
-- (see _redis_gcra.lua); one closure per batch, not per key.
local function digits(n)
  if n < 100000000 then return fmt('%d', n) end
  local lo = fmod(n, 100000000)
  return fmt('%d%08d', (n - lo) / 100000000, lo)
end
-- Every key whose bucket was full (the common case) gets the same tat and
-- TTL: format them once per distinct value, not once per key.
local last_tat, last_value, last_ttl, last_ttl_s
local out = {}
for i = 1, #KEYS do
  local key = KEYS[i]
  local raw = pcall('GET', key)
  local tat = 0
  local write = false
  if raw then
    tat = tonumber(raw)
    if not (tat and tat >= 0 and tat <= 9007199254740991) then
      tat = now + tau
      write = true
    end
  end
  local base = tat
  if now > base then base = now end
  if base - now <= room then
    out[i] = '\1'
    if cost_t > 0 then
      tat = base + cost_t
      write = true
    end
  else
    out[i] = '\0'
  end
  if write then
    if tat ~= last_tat then
      last_tat = tat
      last_value = digits(tat)
      local ttl = floor((tat - now) / 1000) + 1 + slack
      if ttl ~= last_ttl then
        last_ttl = ttl
        last_ttl_s = digits(ttl)
      end
    end
    call('SET', key, last_value, 'PX', last_ttl_s)
  end
end
return table.concat(out)
