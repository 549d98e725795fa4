-- PURGE: delete the dead-letter list, once per call id.
-- KEYS: dead_letter calls call_replies
-- uses: lib/calls.lua lib/clock.lua
-- KEYS[1] dead-letter list, KEYS[2] calls zset, KEYS[3] call replies hash
-- ARGV[1] call id
-- returns: how many entries were deleted (a resend of the call id: the first run's count).
local first = first_run(KEYS[2], ARGV[1])
if first then return tonumber(redis.call('hget', KEYS[3], ARGV[1])) end
local n = redis.call('llen', KEYS[1])
redis.call('unlink', KEYS[1])
remember(KEYS[2], KEYS[3], ARGV[1], now_ms(), string.format('%d', n))
return n
