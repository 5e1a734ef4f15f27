-- nanobucket: single decisions coalesced into one call (see the coalescing in
-- nanobucket/redis.py): decision i is _redis_gcra.lua on KEYS[i], run in
-- order at one reading of the clock, so each gets the reply that script would
-- give at that time (see _redis_gcra.lua for the units, the math and why
-- numbers are formatted the way they are). A key named twice sees its earlier
-- decisions, as sequential calls would.
-- For a single Redis only (a Cluster rejects keys of different slots).
--
-- ARGV[1]    tau_us
-- ARGV[2]    now_us, or '' to read the server's clock (TIME)
-- ARGV[3]    extra ms of TTL for explicit times
-- ARGV[4]    the cost code of every decision, or '' when each has its own:
-- ARGV[4+i]  decision i's cost code: cost_us, or -cost_us - 1 for a peek
--            (consume nothing). One code for all is the common case (every
--            caller calling allow()), and half the arguments to send.
-- returns owed_us per decision, the debt before it: max(tat - now, 0), as
-- _redis_gcra.lua does, as decimal digits joined by ',' (one bulk string:
-- the client parses it in one step, not one RESP integer at a time).
local fmt, fmod, floor, pcall, call = string.format, math.fmod, math.floor, redis.pcall, redis.call
local tau = tonumber(ARGV[1])
local now
local slack = 0
if ARGV[2] == '' then
  local t = call('TIME')
  now = t[1] * 1000000 + t[2]
else
  now = tonumber(ARGV[2])
  slack = tonumber(ARGV[3])
end
local same = nil
if ARGV[4] ~= '' then same = tonumber(ARGV[4]) end
local function digits(n)
  if n < 100000000 then return fmt('%d', n) end
  local lo = fmod(n, 100000000)
  return fmt('%d%08d', (n - lo) / 100000000, lo)
end
-- Buckets that were full (the common case) get the same tat and TTL for the
-- same cost: format them once per distinct value, not once per key.
local last_tat, last_value, last_ttl, last_ttl_s
local out = {}
for i = 1, #KEYS do
  local key = KEYS[i]
  local cost_t = same or tonumber(ARGV[4 + i])
  local consume = true
  if cost_t < 0 then
    cost_t = -cost_t - 1
    consume = false
  end
  local raw = pcall('GET', key)
  local tat = now
  local write = false
  if raw then
    tat = tonumber(raw)
    if not (tat and tat >= 0 and tat <= 9007199254740991) then
      tat = now + tau
      write = true
    end
  end
  local owed = tat - now
  if owed < 0 then owed = 0 end
  if cost_t > 0 and owed <= tau - cost_t then
    tat = now + owed + cost_t
    write = true
  end
  if write and consume then
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
  if owed == 0 then
    out[i] = '0'
  else
    out[i] = digits(owed)
  end
end
return table.concat(out, ',')
