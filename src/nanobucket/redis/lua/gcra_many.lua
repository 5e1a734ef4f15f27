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
-- by one (see read).
local interval = tonumber(ARGV[1])
local tau = tonumber(ARGV[2])
local cost_t = ARGV[3] * interval
local room = tau - cost_t
local now, slack = clock(ARGV[4], ARGV[5])
local last_tat, last_value, last_ttl, last_ttl_s  -- see set_cached
local out = {}
for i = 1, #KEYS do
  local key = KEYS[i]
  -- use: read decide
  if owed <= room then out[i] = '\1' else out[i] = '\0' end
  if write then
    -- use: set_cached
  end
end
return table.concat(out)
