-- lib: clock digits expiry
-- nanobucket: single decisions coalesced into one call (see the asyncio
-- limiter); lib.lua comes first. Decision i is gcra.lua on KEYS[i], run in
-- order at one reading of the clock, so each gets the reply that script would
-- give at that time. A key named twice sees its earlier decisions, as
-- sequential calls would.
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
-- gcra.lua does, as decimal digits joined by ',' (one bulk string: the
-- client parses it in one step, not one RESP integer at a time).
local tau = tonumber(ARGV[1])
local now, slack = clock(ARGV[2], ARGV[3])
local same = nil
if ARGV[4] ~= '' then same = tonumber(ARGV[4]) end
local last_tat, last_value, last_ttl, last_ttl_s  -- see set_cached
local out = {}
for i = 1, #KEYS do
  local key = KEYS[i]
  local cost_t = same or tonumber(ARGV[4 + i])
  local consume = true
  if cost_t < 0 then
    cost_t = -cost_t - 1
    consume = false
  end
  -- use: read decide
  if write and consume then
    -- use: set_cached
  end
  if owed == 0 then
    out[i] = '0'
  else
    out[i] = digits(owed)
  end
end
return table.concat(out, ',')
