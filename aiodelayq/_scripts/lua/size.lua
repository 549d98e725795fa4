-- SIZE: how many items are pending, in the timeout zset and in the tier, in one read.
-- KEYS: timeout_set tier_count
-- KEYS[1] timeout zset, KEYS[2] tier count (lib/tiers.lua)
-- ARGV: (none)
-- returns: ZCARD of the zset plus the tier's count, read atomically (a promotion moves entries from
-- one to the other: two separate reads could count them twice or not at all). Read-only, O(1).
return redis.call('zcard', KEYS[1]) + (tonumber(redis.call('get', KEYS[2])) or 0)
