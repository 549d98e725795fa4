-- SETTLE: ack, nack, dead-letter or release messages in flight.
-- KEYS: in_flight dead_letter destination channel calls call_replies
-- uses: lib/calls.lua lib/clock.lua lib/dead.lua lib/messages.lua
-- ARGV[1] max deliveries (0 = unlimited), ARGV[2] call id (16 bytes), ARGV[3] '' for a first attempt,
--         '1' for a resend after a lost reply, ARGV[4] how long after its first attempt the client may
--         still resend the call (ms)
-- then per settle, 4 arguments: the message element; 'ack' | 'nack' | 'dead' (its payload to the
--         dead-letter list, reason nacked) | 'undecodable' (the same, reason undecodable) |
--         'release' (undo this delivery: nobody saw the message); the nack delay
--         ms; the message's visibility deadline ms. On a resend, a message gone before its deadline
--         can only have been settled by the first attempt (nobody else touches it before then).
--         After its deadline "gone" no longer says who settled it, so a call that a resend may
--         reach after one of its deadlines (within ARGV[4] of now) remembers its reply by call id
--         for CALL_WINDOW_MS, and a resend of it answers that reply and writes nothing.
-- Settles are applied in order (releases of first deliveries are LPUSHed: send them last first).
-- returns: per settle, 1 settled as asked; 2 a nack of the last allowed delivery dead-lettered it;
-- 0 the message was not in flight as this delivery (already settled, or redelivered after its deadline).
local now = now_ms()
local max, id, resend, horizon = tonumber(ARGV[1]), ARGV[2], ARGV[3] ~= '', tonumber(ARGV[4])
if resend and first_run(K, id) then
  local answered = {}
  for result in string.gmatch(redis.call('hget', K.call_replies, id) or '', '%d+') do
    answered[#answered + 1] = tonumber(result)
  end
  return answered
end
local results, earliest = {}, false
-- Acks come in runs (a consumer's write-behind acks): a run is checked with one ZMSCORE and removed
-- with one ZREM (per 1,000) instead of two calls per ack. The other modes go one by one, in order.
local run = {}
local function flush_acks()
  for c = 1, #run, 1000 do
    local last = math.min(c + 999, #run)
    local members = {}
    for j = c, last do members[#members + 1] = ARGV[run[j]] end
    local scores = redis.call('zmscore', K.in_flight, unpack(members))
    local gone, seen = {}, {}
    for j = c, last do
      local i = run[j]
      local result = 1
      if scores[j - c + 1] and not seen[ARGV[i]] then
        -- (the same delivery acked twice in one call: the second finds it gone, as one by one)
        seen[ARGV[i]] = true
        gone[#gone + 1] = ARGV[i]
      elseif not (resend and now < tonumber(ARGV[i + 3])) then
        result = 0
      end
      results[(i - 5) / 4 + 1] = result
    end
    if #gone > 0 then redis.call('zrem', K.in_flight, unpack(gone)) end
  end
  run = {}
end
local function settle_one(i)
  local m, mode = ARGV[i], ARGV[i + 1]
  local result = 1
  if not redis.call('zscore', K.in_flight, m) then
    if not (resend and now < tonumber(ARGV[i + 3])) then result = 0 end
  elseif mode == 'dead' or mode == 'undecodable' then
    local reason = mode == 'dead' and DEAD_NACKED or DEAD_UNDECODABLE
    redis.call('rpush', K.dead_letter, dead_entry(reason, struct.unpack('>I4', m, 21), now, string.sub(m, 33)))
    redis.call('zrem', K.in_flight, m)
  elseif mode == 'release' then
    release(K, m, now)
    -- Visible again now: receivers that looked before this landed, here or elsewhere, look again.
    earliest = now
  else
    local count = struct.unpack('>I4', m, 21)
    if max > 0 and count >= max then
      -- No delivery is left: dead-letter it now instead of leaving it in flight until a receive.
      redis.call('rpush', K.dead_letter, dead_entry(DEAD_MAX_DELIVERIES, count, now, string.sub(m, 33)))
      redis.call('zrem', K.in_flight, m)
      result = 2
    else
      local due = now + tonumber(ARGV[i + 2])
      redis.call('zadd', K.in_flight, 'XX', due, m)
      if not earliest or due < earliest then earliest = due end
    end
  end
  results[(i - 5) / 4 + 1] = result
end
for i = 5, #ARGV, 4 do
  if ARGV[i + 1] == 'ack' then
    run[#run + 1] = i
  else
    flush_acks()
    settle_one(i)
  end
end
flush_acks()
for i = 5, #ARGV, 4 do
  if tonumber(ARGV[i + 3]) <= now + horizon then
    remember(K, id, now, table.concat(results, ','))
    break
  end
end
if earliest then
  -- Every process's transfer task wakes at that time (a nack's due time; now after a release), and its
  -- receivers look again.
  redis.call('publish', K.channel, string.format('%d', earliest))
end
return results
