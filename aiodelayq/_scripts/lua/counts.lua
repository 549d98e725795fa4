-- COUNTS: pending, ready, in-flight and dead-letter counts, the earliest due time and the controls, in one read.
-- KEYS: timeout_set destination in_flight dead_letter controls schedules tier_index tier_count grouped groups dedupe_windows
-- uses: lib/clock.lua lib/groups.lua lib/tiers.lua
-- ARGV: (none)
-- returns: {pending (the tier's items included), ready, in flight, dead letters, earliest due ms
-- (text) or false, paused (1/0), rate limit (items per second, text) or false, its burst (text) or
-- false, recurring items, lag ms (the server clock minus the zset head's due time when that has
-- passed, else 0), tiered (how many of the pending wait in the tier), concurrency limit (text) or
-- false, groups with items waiting or in flight, the group limit, keys held by an open deduplication
-- window (O(log N))}; pending and ready count grouped items
-- (lib/groups.lua) too: O(1) each but the earliest due time (O(log N)), in one atomic read. Read-only.
-- The earliest due time is the zset head's, unless the first bucket of the tier starts before it:
-- then the earliest of that bucket's entries when it holds at most COUNTS_SCAN, else its start (never
-- later than the truth).
local COUNTS_SCAN = 1000
local head = redis.call('zrange', K.timeout_set, 0, 0, 'WITHSCORES')
local c = redis.call('hmget', K.controls, 'paused', 'rate', 'burst', 'cap', 'group_limit')
local lag, now = 0, now_ms()
if head[2] then
  lag = math.max(0, now - tonumber(head[2]))
end
local earliest = head[2] or false
local first = redis.call('zrange', K.tier_index, 0, 0)
if first[1] and (not head[2] or tonumber(first[1]) < tonumber(head[2])) then
  local start = tonumber(first[1])
  local bucket = tier_bucket(K, first[1])
  local soonest = nil
  if redis.call('llen', bucket) <= COUNTS_SCAN then
    for _, e in ipairs(redis.call('lrange', bucket, 0, -1)) do
      local due = tier_entry(e, start)
      if soonest == nil or due < soonest then soonest = due end
    end
  end
  soonest = soonest or start
  if not head[2] or soonest < tonumber(head[2]) then earliest = string.format('%d', soonest) end
end
local tiered = tonumber(redis.call('get', K.tier_count)) or 0
local waiting = tonumber(redis.call('hget', K.groups, '')) or 0
local groups = redis.call('hlen', K.groups) - redis.call('hexists', K.groups, '')
  - redis.call('hexists', K.groups, GROUPS_HASH_TABLE)
local grouped_head = redis.call('zrange', K.grouped, 0, 0, 'WITHSCORES')[2]
if grouped_head and (not earliest or tonumber(grouped_head) < tonumber(earliest)) then earliest = grouped_head end
return {redis.call('zcard', K.timeout_set) + tiered + redis.call('zcard', K.grouped), redis.call('llen', K.destination) + waiting,
        redis.call('zcard', K.in_flight), redis.call('llen', K.dead_letter), earliest, c[1] and 1 or 0,
        c[2] or false, c[3] or false, redis.call('hlen', K.schedules), lag, tiered, c[4] or false, groups,
        tonumber(c[5]) or 1, redis.call('zcount', K.dedupe_windows, '(' .. now, '+inf')}
