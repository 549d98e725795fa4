-- defines: HOLD_CAPPED controls_allow controls_charge forget_ended_nacks held_messages
-- uses: lib/clock.lua
-- The queue's controls (its hash K.controls, see QueueKeys.controls), shared by every consumer.
-- controls_allow(K, want, now): how many of `want` items a consumer may have now, the hold (-1:
-- paused, none until resumed; > 0: rate limited, ms until the next whole token; 0: not held), for
-- a rate limit the token bucket's level and the server time (ms) for controls_charge (nil, nil
-- without one), and the concurrency limit (nil without one: RECEIVE applies it, see
-- held_messages). `now` is the caller's server time (ms) if it read one; else TIME is read only
-- for a rate limit. The bucket fills at `rate` tokens a second on the server clock, up to `burst`;
-- a new bucket is full.
local HOLD_CAPPED = -2  -- RECEIVE's hold when the concurrency limit leaves no room
local function controls_allow(K, want, now)
  local c = redis.call('hmget', K.controls, 'paused', 'rate', 'burst', 'tokens', 'at', 'cap')
  local cap = tonumber(c[6])
  if c[1] then return 0, -1, nil, nil, cap end
  if not c[2] then return want, 0, nil, nil, cap end
  now = now or now_ms()
  local rate, burst = tonumber(c[2]), tonumber(c[3])
  local level = burst
  if c[4] and c[5] then
    level = math.min(burst, tonumber(c[4]) + math.max(0, now - tonumber(c[5])) * rate / 1000)
  end
  local n = math.min(want, math.floor(level))
  local hold = 0
  if n < want then hold = math.max(1, math.ceil((n + 1 - level) * 1000 / rate)) end
  return n, hold, level, now, cap
end

-- controls_charge(K, now ms, level, used): take `used` tokens from the bucket controls_allow read.
local function controls_charge(K, now, level, used)
  if level and used > 0 then redis.call('hset', K.controls, 'tokens', tostring(level - used), 'at', now) end
end

-- forget_ended_nacks(K, now ms): drop the entries of K.nacked (messages nacked with a delay, scored
-- by when they are visible again) whose delay has ended; it holds only those that wait.
local function forget_ended_nacks(K, now)
  local ended = redis.call('zcount', K.nacked, '-inf', now)
  if ended > 0 then redis.call('zremrangebyrank', K.nacked, 0, ended - 1) end
end

-- held_messages(K, now ms): the messages consumers hold, as the concurrency limit counts them: in
-- flight before their visibility deadline, less those nacked with a delay that wait it out.
local function held_messages(K, now)
  forget_ended_nacks(K, now)
  return redis.call('zcount', K.in_flight, string.format('(%d', now), '+inf') - redis.call('zcard', K.nacked)
end
