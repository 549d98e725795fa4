-- CANCEL: remove the pending element of a key, once per call id.
-- KEYS: timeout_set delay_list key_index channel calls call_replies schedules grouped controls event_stream
-- uses: lib/calls.lua lib/clock.lua lib/events.lua lib/groups.lua lib/index.lua lib/parse.lua
-- ARGV[1] call id, ARGV[2] key, ARGV[3] its tag
-- returns: 1 if the pending item of the key was removed or its recurring item stopped, 0 if
-- neither (a stale index entry is dropped). A resend of the call id returns the first run's answer.
if first_run(K, ARGV[1]) then return tonumber(redis.call('hget', K.call_replies, ARGV[1])) end
local v, score, field, zset = index_find(K, ARGV[3], ARGV[2])
local removed = 0
if score then
  redis.call('zrem', zset, v)
  local payload, fast = parse(v)
  if not fast then redis.call('lrem', K.delay_list, 1, v) end
  removed = 1
  if events_on(K) then event_add(K, 'cancelled', ARGV[2], nil, payload and group_of(payload)) end
end
if field then redis.call('hdel', K.key_index, field) end
if redis.call('hdel', K.schedules, ARGV[2]) == 1 then removed = 1 end
remember(K, ARGV[1], now_ms(), tostring(removed))
return removed
