-- CANCEL: remove the pending element of a key, once per call id.
-- KEYS: timeout_set delay_list key_index channel calls call_replies schedules
-- uses: lib/calls.lua lib/clock.lua lib/index.lua lib/parse.lua
-- KEYS[1] timeout zset, KEYS[2] delay list, KEYS[3] key index hash, KEYS[4] channel, KEYS[5] calls
-- zset, KEYS[6] call replies hash, KEYS[7] schedules hash
-- ARGV[1] call id, ARGV[2] key, ARGV[3] its tag
-- returns: 1 if the pending item of the key was removed or its recurring item stopped, 0 if
-- neither (a stale index entry is dropped). A resend of the call id returns the first run's answer.
if first_run(KEYS[5], ARGV[1]) then return tonumber(redis.call('hget', KEYS[6], ARGV[1])) end
local v, score, field = index_find(KEYS[3], KEYS[1], ARGV[3], ARGV[2])
local removed = 0
if score then
  redis.call('zrem', KEYS[1], v)
  local _, fast = parse(v)
  if not fast then redis.call('lrem', KEYS[2], 1, v) end
  removed = 1
end
if field then redis.call('hdel', KEYS[3], field) end
if redis.call('hdel', KEYS[7], ARGV[2]) == 1 then removed = 1 end
remember(KEYS[5], KEYS[6], ARGV[1], now_ms(), tostring(removed))
return removed
