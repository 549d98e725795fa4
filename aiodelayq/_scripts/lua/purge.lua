-- PURGE: delete the dead-letter list, once per call id.
-- KEYS: dead_letter calls call_replies
-- uses: lib/calls.lua lib/clock.lua
-- ARGV[1] call id
-- returns: how many entries were deleted (a resend of the call id: the first run's count).
local first = first_run(K, ARGV[1])
if first then return tonumber(redis.call('hget', K.call_replies, ARGV[1])) end
local n = redis.call('llen', K.dead_letter)
redis.call('unlink', K.dead_letter)
remember(K, ARGV[1], now_ms(), string.format('%d', n))
return n
