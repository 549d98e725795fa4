-- EXTEND: move a message's visibility deadline.
-- KEYS: in_flight
-- uses: lib/clock.lua
-- ARGV[1] the message element (this delivery), ARGV[2] visibility timeout ms
-- returns: the new visibility deadline (server ms: now + timeout) if the delivery is still in
-- flight (not settled, not delivered again), else false. A resend sets a deadline a little later.
if not redis.call('zscore', K.in_flight, ARGV[1]) then return false end
local deadline = now_ms() + tonumber(ARGV[2])
redis.call('zadd', K.in_flight, 'XX', deadline, ARGV[1])
return deadline
