-- SET_CONTROLS: pause or resume the queue's consumers, set or remove its rate limit, its
-- concurrency limit, set its group limit, or turn its event stream on or off.
-- KEYS: controls channel groups group_ready event_stream
-- uses: lib/clock.lua lib/groups.lua lib/wake.lua
-- ARGV[1] 'pause', 'resume', 'rate', 'unrate', 'cap', 'uncap', 'group_limit', 'events' or
-- 'unevents' (the stream deleted: lib/events.lua); for 'events': ARGV[2] its cap (>= 1); for 'rate': ARGV[2]
-- items per second (> 0, text), ARGV[3] the bucket's size (burst, >= 1); for 'cap': ARGV[2] the most
-- messages held at once (>= 1); for 'group_limit': ARGV[2] the most messages of one group in
-- flight at once (>= 1; lib/groups.lua)
-- returns: 1. Every consumer's next POP or RECEIVE sees the change (nothing is cached). Setting a
-- rate limit starts a full bucket. Setting or removing a concurrency limit publishes now, so the
-- consumers a lower one held back look again; so does a group limit, and a higher one admits the
-- next items of each group it has room for (O(groups with items admitted or waiting)); a lower one
-- takes back nothing admitted (lib/groups.lua). Idempotent.
local op = ARGV[1]
if op == 'pause' then
  redis.call('hset', K.controls, 'paused', 1)
elseif op == 'resume' then
  redis.call('hdel', K.controls, 'paused')
elseif op == 'rate' then
  redis.call('hset', K.controls, 'rate', ARGV[2], 'burst', ARGV[3])
  redis.call('hdel', K.controls, 'tokens', 'at')
elseif op == 'group_limit' then
  local old, new = group_limit(K), tonumber(ARGV[2])
  if new == 1 then redis.call('hdel', K.controls, 'group_limit') else redis.call('hset', K.controls, 'group_limit', new) end
  if new > old then
    -- Each group whose list may hold items, with fewer than `new` admitted: its next ones are
    -- admitted now.
    local fields, groups, admits, waits, before = redis.call('hgetall', K.groups), {}, {}, {}, {}
    for i = 1, #fields, 2 do
      local g = fields[i]
      if g ~= '' and g ~= GROUPS_HASH_TABLE then
        local admitted, waiting, value = group_field(fields[i + 1])
        if waiting and admitted < new then
          local n = #groups + 1
          groups[n], admits[n], waits[n], before[n] = g, admitted, waiting, value
        end
      end
    end
    groups_admit(K, groups, admits, waits, new)
    groups_write(K, groups, admits, waits, before)
  end
  wake_consumers(K, now_ms())
elseif op == 'events' then
  redis.call('hset', K.controls, 'events', ARGV[2])
elseif op == 'unevents' then
  redis.call('hdel', K.controls, 'events')
  redis.call('unlink', K.event_stream)
elseif op == 'unrate' then
  redis.call('hdel', K.controls, 'rate', 'burst', 'tokens', 'at')
else
  if op == 'cap' then
    redis.call('hset', K.controls, 'cap', ARGV[2])
  else
    redis.call('hdel', K.controls, 'cap')
  end
  wake_consumers(K, now_ms())
end
return 1
