-- SET_CONTROLS: pause or resume the queue's consumers, set or remove its rate limit, or its
-- concurrency limit.
-- KEYS: controls channel
-- uses: lib/clock.lua
-- ARGV[1] 'pause', 'resume', 'rate', 'unrate', 'cap' or 'uncap'; for 'rate': ARGV[2] items per
-- second (> 0, text), ARGV[3] the bucket's size (burst, >= 1); for 'cap': ARGV[2] the most messages
-- held at once (>= 1)
-- returns: 1. Every consumer's next POP or RECEIVE sees the change (nothing is cached). Setting a
-- rate limit starts a full bucket. Setting or removing a concurrency limit publishes now, so the
-- consumers a lower one held back look again. Idempotent.
local op = ARGV[1]
if op == 'pause' then
  redis.call('hset', K.controls, 'paused', 1)
elseif op == 'resume' then
  redis.call('hdel', K.controls, 'paused')
elseif op == 'rate' then
  redis.call('hset', K.controls, 'rate', ARGV[2], 'burst', ARGV[3])
  redis.call('hdel', K.controls, 'tokens', 'at')
elseif op == 'unrate' then
  redis.call('hdel', K.controls, 'rate', 'burst', 'tokens', 'at')
else
  if op == 'cap' then
    redis.call('hset', K.controls, 'cap', ARGV[2])
  else
    redis.call('hdel', K.controls, 'cap')
  end
  redis.call('publish', K.channel, string.format('%d', now_ms()))
end
return 1
