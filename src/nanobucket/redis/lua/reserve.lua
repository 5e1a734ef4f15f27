-- lib: clock digits expiry
-- nanobucket: reserve tokens on one key, possibly past empty (see acquire);
-- lib.lua comes first. Same state and units as gcra.lua. A reservation is a
-- place in line: the tat moves past "empty" and every later caller sees it owed.
--
-- KEYS[1]  the bucket
-- ARGV[1]  tau_us        capacity * interval_us
-- ARGV[2]  cost_us       cost * interval_us
-- ARGV[3]  now_us, or '' to read the server's clock (TIME)
-- ARGV[4]  max_wait_us   reserve nothing when the wait would be longer
-- ARGV[5]  '1' shape (due at the start of its slot), '0' due when the tokens exist
-- ARGV[6]  extra ms of TTL for explicit times
-- returns the us to wait before the tokens may be used, or -1 (nothing reserved)
-- A key that does not hold a bucket counts as an empty one (see read).
local tau = tonumber(ARGV[1])
local cost_t = tonumber(ARGV[2])
local now, slack = clock(ARGV[3], ARGV[6])
local key = KEYS[1]
-- use: read
local base = tat
if now > base then base = now end
local lead = tau
if ARGV[5] == '1' then lead = cost_t end
local wait = base - now - (lead - cost_t)
if wait < 0 then wait = 0 end
if wait > tonumber(ARGV[4]) or base + cost_t > 9007199254740991 then return -1 end
if cost_t > 0 then
  tat = base + cost_t
  call('SET', key, digits(tat), 'PX', digits(expiry(tat, now, slack)))
end
return wait
