-- SET_CONTROLS: pause or resume the queue's consumers, or set or remove its rate limit.
-- KEYS: controls
-- ARGV[1] 'pause', 'resume', 'rate' or 'unrate'; for 'rate': ARGV[2] items per second (> 0, text),
-- ARGV[3] the bucket's size (burst, >= 1)
-- returns: 1. Every consumer's next POP or RECEIVE sees the change (nothing is cached). Setting a
-- rate limit starts a full bucket. Idempotent.
local op = ARGV[1]
if op == 'pause' then
  redis.call('hset', K.controls, 'paused', 1)
elseif op == 'resume' then
  redis.call('hdel', K.controls, 'paused')
elseif op == 'rate' then
  redis.call('hset', K.controls, 'rate', ARGV[2], 'burst', ARGV[3])
  redis.call('hdel', K.controls, 'tokens', 'at')
else
  redis.call('hdel', K.controls, 'rate', 'burst', 'tokens', 'at')
end
return 1
