-- nanobucket: one GCRA decision on one key. The hottest script: it calls
-- no function of lib.lua (see its header for the cost measured) and takes
-- the rule as blocks pasted in (read, decide). Integers in microseconds.
--
-- KEYS[1]  the bucket: a string holding tat (theoretical arrival time, us)
-- ARGV[1]  tau_us        capacity * interval_us
-- ARGV[2]  cost_us       cost * interval_us
-- ARGV[3]  now_us, or '' to read the server's clock (TIME)
-- ARGV[4]  '1' consume when admitted, '0' peek
-- Keys written at explicit times live 86,400,000 ms longer than their debt
-- (their clock is not Redis's): EXPLICIT_TTL_SLACK_MS, written here rather
-- than sent, since each argument costs Redis about 1,200 instructions a call
-- (tests/test_redis_scripts.py checks the two agree).
-- returns owed_us, the debt before this decision: max(tat - now, 0). The
-- client derives the rest (admitted iff owed_us <= tau_us - cost_us), so
-- Redis's one core does no more than it must.
--
-- A key that does not hold a bucket (another type, not a number, inf, nan,
-- negative, past 2^53) counts as an empty bucket (owed_us = tau_us) and,
-- when consuming, is replaced by one: never an error, never a token the
-- bucket did not have.
local tau = tonumber(ARGV[1])
local cost_t = tonumber(ARGV[2])
local now
local slack = 0
if ARGV[3] == '' then
  local t = redis.call('TIME')
  now = t[1] * 1000000 + t[2]
else
  now = tonumber(ARGV[3])
  slack = 86400000  -- EXPLICIT_TTL_SLACK_MS
end
local key = KEYS[1]
-- use: read decide
if write and ARGV[4] == '1' then
  -- redis.call formats a number argument itself, exactly below 2^53 ('%.17g';
  -- Redis 7.2 and Valkey as an integer): no digits of our own to format.
  redis.call('SET', key, tat, 'PX', math.floor((tat - now) / 1000) + 1 + slack)
end
return owed
