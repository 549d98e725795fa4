-- SIZE: how many items are pending, in the timeout zset, the tier and the grouped zset, in one read.
-- KEYS: timeout_set tier_count grouped
-- ARGV: (none)
-- returns: ZCARD of the zset plus the tier's count and the grouped zset's ZCARD, read atomically (a promotion moves entries from
-- one to the other: two separate reads could count them twice or not at all). Read-only, O(1).
return redis.call('zcard', K.timeout_set) + (tonumber(redis.call('get', K.tier_count)) or 0)
  + redis.call('zcard', K.grouped)
