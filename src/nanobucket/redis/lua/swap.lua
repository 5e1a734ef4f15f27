-- nanobucket: replace one bucket's value only if it is still the one read
-- (see reconfigure): a compare-and-swap, so a decision
-- made between the read and the write is never overwritten.
--
-- KEYS[1]  the bucket
-- ARGV[1]  the value read
-- ARGV[2]  the new value, or '' to delete the key (a full bucket)
-- ARGV[3]  its TTL in ms
-- returns 1 if swapped, 0 if the value had changed
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
if ARGV[2] == '' then
  redis.call('DEL', KEYS[1])
else
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
end
return 1
