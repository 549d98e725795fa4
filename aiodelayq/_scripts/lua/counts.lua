-- COUNTS: pending, ready, in-flight and dead-letter counts, the earliest due time and the controls, in one read.
-- KEYS: timeout_set destination in_flight dead_letter controls schedules
-- KEYS[1] timeout zset, KEYS[2] destination list, KEYS[3] in-flight zset, KEYS[4] dead-letter list,
-- KEYS[5] controls hash, KEYS[6] schedules hash
-- ARGV: (none)
-- returns: {pending, ready, in flight, dead letters, earliest due ms (text) or false, paused (1/0),
-- rate limit (items per second, text) or false, its burst (text) or false, recurring items, lag ms (the
-- server clock minus the earliest due time when that has passed, else 0)}: O(1) each but the earliest due
-- time (O(log N)), in one atomic read. Read-only.
local head = redis.call('zrange', KEYS[1], 0, 0, 'WITHSCORES')
local c = redis.call('hmget', KEYS[5], 'paused', 'rate', 'burst')
local lag = 0
if head[2] then
  lag = math.max(0, now_ms() - tonumber(head[2]))
end
return {redis.call('zcard', KEYS[1]), redis.call('llen', KEYS[2]), redis.call('zcard', KEYS[3]),
        redis.call('llen', KEYS[4]), head[2] or false, c[1] and 1 or 0, c[2] or false, c[3] or false,
        redis.call('hlen', KEYS[6]), lag}
