-- nanobucket: the limit a prefix's buckets are kept in, recorded by the first
-- limiter that talks to Redis (see redis/_prefix.py): every limiter sharing
-- the prefix must keep its buckets in the same terms.
--
-- KEYS[1]  the prefix's params key (<prefix>:params)
-- ARGV[1]  this limiter's "<interval_us> <tau_us>"
-- returns the value stored: ARGV[1] if the key was missing (now set)
local stored = redis.call('GET', KEYS[1])
if not stored then
  redis.call('SET', KEYS[1], ARGV[1])
  return ARGV[1]
end
return stored
