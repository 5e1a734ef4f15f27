-- lib: clock digits expiry
-- nanobucket: a batch of GCRA decisions, one per key in KEYS, in order, at
-- one reading of the clock; lib.lua comes first (see gcra.lua for the math).
-- For a single Redis only: a Cluster rejects keys of different slots in one
-- script, so there the limiter pipelines gcra.lua instead.
--
-- ARGV[1] interval_us, ARGV[2] tau_us, ARGV[3] cost, ARGV[4] now_us or '',
-- ARGV[5] extra ms of TTL for explicit times.
-- returns a string of one byte per key: 1 admitted, 0 refused
-- A key that does not hold a bucket counts as an empty one and is replaced
-- by one (see read_tat, inline here: it runs once per key).
local interval = tonumber(ARGV[1])
local tau = tonumber(ARGV[2])
local cost_t = ARGV[3] * interval
local room = tau - cost_t
local now, slack = clock(ARGV[4], ARGV[5])
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
      local ttl = expiry(tat, now, slack)
      if ttl ~= last_ttl then
        last_ttl = ttl
        last_ttl_s = digits(ttl)
      end
    end
    call('SET', key, last_value, 'PX', last_ttl_s)
  end
end
return table.concat(out)
