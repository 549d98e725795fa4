-- COUNTS: pending, ready, in-flight and dead-letter counts and the earliest due time, in one read.
-- KEYS: timeout_set destination in_flight dead_letter
-- KEYS[1] timeout zset, KEYS[2] destination list, KEYS[3] in-flight zset, KEYS[4] dead-letter list
-- ARGV: (none)
-- returns: {pending, ready, in flight, dead letters, earliest due ms (text) or false}: O(1) each
-- but the last (O(log N)), in one atomic read. Read-only.
local head = redis.call('zrange', KEYS[1], 0, 0, 'WITHSCORES')
return {redis.call('zcard', KEYS[1]), redis.call('llen', KEYS[2]), redis.call('zcard', KEYS[3]),
        redis.call('llen', KEYS[4]), head[2] or false}
