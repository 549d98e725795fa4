-- EXTEND: move a message's visibility deadline.
-- KEYS: in_flight
-- uses: lib/clock.lua
-- KEYS[1] in-flight zset
-- ARGV[1] the message element (this delivery), ARGV[2] visibility timeout ms
-- returns: the new visibility deadline (server ms: now + timeout) if the delivery is still in
-- flight (not settled, not delivered again), else false. A resend sets a deadline a little later.
if not redis.call('zscore', KEYS[1], ARGV[1]) then return false end
local deadline = now_ms() + tonumber(ARGV[2])
redis.call('zadd', KEYS[1], 'XX', deadline, ARGV[1])
return deadline
