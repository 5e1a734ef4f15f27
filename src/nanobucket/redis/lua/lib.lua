-- nanobucket: the Lua library of the Redis scripts (see nanobucket/redis/).
-- The limiter prepends the parts a script names to that script when it
-- loads it: Redis still sees one chunk, one SHA, one call.
--
-- State: one key per bucket holding tat (theoretical arrival time) in
-- microseconds; a missing key is a full bucket. Every value stays below
-- 2^53, so Lua's doubles hold them exactly.
--
-- Cost. Redis runs a script's whole chunk on every call (a script cannot
-- keep a global), so a function here is made anew each time, with the
-- locals it captures, and each call of it costs Redis's CPU more than the
-- same lines inline: under callgrind (benchmarks/bench_redis_cpu.py
-- --callgrind) the single decision (gcra.lua) cost 15 % more through a
-- decide function (58,000 -> 67,000 instructions per call), a batch 4 %
-- more per key. So the rule itself is two blocks, read and decide (and the
-- batch write one more, set_cached), that the limiter pastes where a script
-- has a line `-- use: read decide`: no function, no call, written once
-- (gcra.lua, without the head below, takes only blocks). The functions (clock, digits, expiry,
-- store) serve once per call or once per distinct value; a script takes
-- those it names on its first line (`-- lib: clock digits`), in the order
-- they come here; the locals below always come. Parts start with a line
-- `--- name`.
local fmt, fmod, floor = string.format, math.fmod, math.floor
local call = redis.call

--- clock
-- now_us and the TTL slack in ms: the server's clock (TIME) when the caller
-- sent '' for now, else the caller's now and slack (an explicit clock is not
-- Redis's: its keys live that much longer).
local function clock(now_arg, slack_arg)
  if now_arg == '' then
    local t = call('TIME')
    return t[1] * 1000000 + t[2], 0
  end
  return tonumber(now_arg), tonumber(slack_arg)
end

--- digits
-- A whole number as exact decimal digits. '%d' formats a C long, 32 bits on
-- some platforms: past 10^8 the number goes as two halves (Lua's tostring
-- keeps 14 digits, '%.0f' costs twice as much).
local function digits(n)
  if n < 100000000 then return fmt('%d', n) end
  local lo = fmod(n, 100000000)
  return fmt('%d%08d', (n - lo) / 100000000, lo)
end

--- expiry
-- The TTL in ms of a key holding tat: floor(debt / 1000) + 1 >= ceil(debt /
-- 1000) even when the division rounds, so the key outlives its debt and
-- expiry never frees a token early.
local function expiry(tat, now, slack)
  return floor((tat - now) / 1000) + 1 + slack
end

--- read
-- A block (`-- use: read`). In: key, now, tau. Out: tat, the bucket's (now
-- for a missing key: a full bucket), and write, true when the key holds no
-- bucket: another type (pcall: WRONGTYPE is a value, not an error), not a
-- number, inf, nan, negative or past 2^53. Such a key is an empty bucket
-- (tat = now + tau), replaced by a real one on a write: never an error,
-- never a token the bucket did not have.
local raw = redis.pcall('GET', key)
local tat = now
local write = false
if raw then
  tat = tonumber(raw)  -- nil for an error reply (a table) or a non-number
  if not (tat and tat >= 0 and tat <= 9007199254740991) then
    tat = now + tau
    write = true
  end
end

--- decide
-- A block (`-- use: decide`, after read): one GCRA decision. In: tat, now,
-- tau, cost_t, write. Out: owed = max(tat - now, 0), the debt before it;
-- cost_t spent (tat moved, write set) iff cost_t > 0 and owed <= tau - cost_t.
local owed = tat - now
if owed < 0 then owed = 0 end
if cost_t > 0 and owed <= tau - cost_t then
  tat = now + owed + cost_t
  write = true
end

--- set_cached
-- A block (`-- use: set_cached`, in a batch's loop): SET key to tat with its
-- TTL. The keys of a batch that were full (the common case) get the same tat
-- and TTL for the same cost, so each distinct value is formatted once per
-- call, not once per key: the loop keeps the last in locals declared before
-- it, `local last_tat, last_value, last_ttl, last_ttl_s`.
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

--- store
-- Store tat at key with its TTL; a tat not past now is a full bucket: no key.
local function store(key, tat, now, slack)
  if tat <= now then
    call('DEL', key)
  else
    call('SET', key, digits(tat), 'PX', digits(expiry(tat, now, slack)))
  end
end
