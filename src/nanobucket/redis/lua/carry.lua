-- nanobucket: carry a bucket over to a new limit's key space (see reconfigure):
-- the stricter of the bucket carried and the one already there, so a decision
-- made under the new limit meanwhile is never undone.
--
-- KEYS[1]  the bucket under the new limit
-- ARGV[1]  tat carried over (us)
-- ARGV[2]  its TTL in ms
-- returns 1 if written, 0 if the bucket there already owed as much or more
local tat = tonumber(ARGV[1])
local ok, held = pcall(redis.call, 'GET', KEYS[1])
-- Another type, or a value that is not a number: not a bucket, an empty one
-- (lua/lib.lua's read): nothing is stricter, so it stays.
if not ok then return 0 end
if held then
  local there = tonumber(held)
  if there == nil or there ~= there or there >= tat then return 0 end
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
