"""Lua of reliable consumption: RECEIVE (pop and register in flight), RELEASE_CALL (undo a receive
nobody saw), SETTLE (ack, nack, dead-letter, release). A message in flight sits in the in-flight
zset scored by its visibility deadline (server ms)."""

from __future__ import annotations

from .._redis.connections import Script
from .prelude import with_prelude

__all__ = ["EXTEND", "RECEIVE", "RELEASE_CALL", "SETTLE"]

# Message elements (layout in aiodelayq/_wire/elements.py): 'adq' 0x02 | 16-byte id | '>I4' delivery count |
# '>d' due ms of this delivery (0 = unknown: a first delivery) | payload.
_MESSAGES = """
local MSG_MAGIC = 'adq' .. string.char(2)
local function message(id, count, due, payload)
  return MSG_MAGIC .. id .. struct.pack('>I4>d', count, due) .. payload
end
-- Undo one delivery nobody saw: a first delivery goes back to the head of the destination, as
-- if never received; a redelivery gets its count lowered and is visible again at once.
local function release(inflight, destination, m, now)
  local count, due = struct.unpack('>I4>d', m, 21)
  if count <= 1 then
    redis.call('lpush', destination, string.sub(m, 33))
  else
    redis.call('zadd', inflight, now, message(string.sub(m, 5, 20), count - 1, due, string.sub(m, 33)))
  end
  redis.call('zrem', inflight, m)
end
-- The messages a RECEIVE call returned, from its remembered record (deadline '>d' | 16-byte ids).
local function received(inflight, record)
  local out = {}
  if record and string.len(record) >= 8 then
    local deadline = struct.unpack('>d', record, 1)
    local ids = {}
    for p = 9, string.len(record), 16 do ids[string.sub(record, p, p + 15)] = true end
    for _, m in ipairs(redis.call('zrangebyscore', inflight, deadline, deadline)) do
      if ids[string.sub(m, 5, 20)] then out[#out + 1] = m end
    end
  end
  return out
end
"""

RECEIVE = Script("receive", with_prelude(_MESSAGES + """
-- KEYS[1] destination list, KEYS[2] in-flight zset, KEYS[3] dead-letter list, KEYS[4] calls zset,
-- KEYS[5] call replies hash
-- ARGV[1] at most this many messages, ARGV[2] visibility timeout ms, ARGV[3] max deliveries
-- (0 = unlimited), ARGV[4] call id (16 random bytes; fresh message ids are its first 12 bytes and
-- a 4-byte index)
-- returns: {now ms (a resend: the first run's), earliest in-flight deadline (ms, text) or false,
--           dead-lettered count, messages...}
-- Messages whose visibility deadline passed are delivered again first (count + 1; past the limit
-- their payload goes to the dead-letter list instead); then fresh payloads are popped from the
-- destination. Every message returned is already in flight: a reply lost on the way, or a consumer
-- that dies, only delays it until its deadline. A resend of the call id returns the same messages
-- (those still in flight as that delivery), without popping or counting anything.
local now = now_ms()
local limit, vt, max = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local out, dead = {}, 0
local first = first_run(KEYS[4], ARGV[4])
if first then
  out = received(KEYS[2], redis.call('hget', KEYS[5], ARGV[4]))
  -- Reply with the first run's time: the client computes each message's deadline from it.
  now = first
else
  local expired = redis.call('zrangebyscore', KEYS[2], '-inf', now, 'LIMIT', 0, limit)
  for _, e in ipairs(expired) do
    local valid = string.len(e) >= 32 and string.sub(e, 1, 4) == MSG_MAGIC
    local count = valid and struct.unpack('>I4', e, 21) or 0
    if not valid then
      -- Not a message element (someone else's garbage): moved aside as it was, never a stall.
      redis.call('rpush', KEYS[3], dead_entry(DEAD_MALFORMED, 0, now, e))
      dead = dead + 1
    elseif max > 0 and count >= max then
      redis.call('rpush', KEYS[3], dead_entry(DEAD_MAX_DELIVERIES, count, now, string.sub(e, 33)))
      dead = dead + 1
    else
      local became_due = tonumber(redis.call('zscore', KEYS[2], e))
      local m = message(string.sub(e, 5, 20), count + 1, became_due, string.sub(e, 33))
      redis.call('zadd', KEYS[2], now + vt, m)
      out[#out + 1] = m
    end
    redis.call('zrem', KEYS[2], e)
  end
  local want = limit - #out - dead
  if want > 0 then
    local fresh = redis.call('lpop', KEYS[1], want)
    if fresh then
      local prefix, deadline, scored = string.sub(ARGV[4], 1, 12), now + vt, {}
      for i, payload in ipairs(fresh) do
        local m = message(prefix .. struct.pack('>I4', i), 1, 0, payload)
        scored[2 * i - 1], scored[2 * i] = deadline, m
        out[#out + 1] = m
      end
      -- One ZADD per 500 messages, not one per message: a receive of 100 cost 4.3 us of server
      -- time per message with a call each.
      chunked('zadd', KEYS[2], nil, scored)
    end
  end
  if #out > 0 then
    local ids = {struct.pack('>d', now + vt)}
    for _, m in ipairs(out) do ids[#ids + 1] = string.sub(m, 5, 20) end
    remember(KEYS[4], KEYS[5], ARGV[4], now, table.concat(ids))
  end
end
local head = redis.call('zrange', KEYS[2], 0, 0, 'WITHSCORES')
local result = {now, head[2] or false, dead}
for _, m in ipairs(out) do result[#result + 1] = m end
return result
"""))

RELEASE_CALL = Script("release_call", with_prelude(_MESSAGES + """
-- KEYS[1] in-flight zset, KEYS[2] destination list, KEYS[3] calls zset, KEYS[4] call replies hash
-- ARGV[1] the call id of a RECEIVE whose caller was cancelled (or whose reply was lost for good)
-- returns: how many messages were released (their delivery undone, see release()).
-- If that RECEIVE has not run (yet), its id is remembered with an empty record, so a late arrival
-- of it on a dropped connection receives nothing.
local now = now_ms()
local n = 0
if first_run(KEYS[3], ARGV[1]) then
  for _, m in ipairs(received(KEYS[1], redis.call('hget', KEYS[4], ARGV[1]))) do
    release(KEYS[1], KEYS[2], m, now)
    n = n + 1
  end
  redis.call('hset', KEYS[4], ARGV[1], '')
else
  remember(KEYS[3], KEYS[4], ARGV[1], now, '')
end
return n
"""))

SETTLE = Script("settle", with_prelude(_MESSAGES + """
-- KEYS[1] in-flight zset, KEYS[2] dead-letter list, KEYS[3] destination list, KEYS[4] channel
-- ARGV[1] max deliveries (0 = unlimited), ARGV[2] '' for a first attempt, '1' for a resend after a
--         lost reply
-- then per settle, 4 arguments: the message element; 'ack' | 'nack' | 'dead' (its payload to the
--         dead-letter list, reason nacked) | 'undecodable' (the same, reason undecodable) |
--         'release' (undo this delivery: nobody saw the message); the nack delay
--         ms; the message's visibility deadline ms. On a resend, a message gone before its deadline
--         can only have been settled by the first attempt (nobody else touches it before then).
-- Settles are applied in order (releases of first deliveries are LPUSHed: send them last first).
-- returns: per settle, 1 settled as asked; 2 a nack of the last allowed delivery dead-lettered it;
-- 0 the message was not in flight as this delivery (already settled, or redelivered after its deadline).
local now = now_ms()
local max, resend = tonumber(ARGV[1]), ARGV[2] ~= ''
local results, earliest = {}, false
-- Acks come in runs (a consumer's write-behind acks): a run is checked with one ZMSCORE and removed
-- with one ZREM (per 1,000) instead of two calls per ack. The other modes go one by one, in order.
local run = {}
local function flush_acks()
  for c = 1, #run, 1000 do
    local last = math.min(c + 999, #run)
    local members = {}
    for j = c, last do members[#members + 1] = ARGV[run[j]] end
    local scores = redis.call('zmscore', KEYS[1], unpack(members))
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
      results[(i - 3) / 4 + 1] = result
    end
    if #gone > 0 then redis.call('zrem', KEYS[1], unpack(gone)) end
  end
  run = {}
end
local function settle_one(i)
  local m, mode = ARGV[i], ARGV[i + 1]
  local result = 1
  if not redis.call('zscore', KEYS[1], m) then
    if not (resend and now < tonumber(ARGV[i + 3])) then result = 0 end
  elseif mode == 'dead' or mode == 'undecodable' then
    local reason = mode == 'dead' and DEAD_NACKED or DEAD_UNDECODABLE
    redis.call('rpush', KEYS[2], dead_entry(reason, struct.unpack('>I4', m, 21), now, string.sub(m, 33)))
    redis.call('zrem', KEYS[1], m)
  elseif mode == 'release' then
    release(KEYS[1], KEYS[3], m, now)
    -- Visible again now: receivers that looked before this landed, here or elsewhere, look again.
    earliest = now
  else
    local count = struct.unpack('>I4', m, 21)
    if max > 0 and count >= max then
      -- No delivery is left: dead-letter it now instead of leaving it in flight until a receive.
      redis.call('rpush', KEYS[2], dead_entry(DEAD_MAX_DELIVERIES, count, now, string.sub(m, 33)))
      redis.call('zrem', KEYS[1], m)
      result = 2
    else
      local due = now + tonumber(ARGV[i + 2])
      redis.call('zadd', KEYS[1], 'XX', due, m)
      if not earliest or due < earliest then earliest = due end
    end
  end
  results[(i - 3) / 4 + 1] = result
end
for i = 3, #ARGV, 4 do
  if ARGV[i + 1] == 'ack' then
    run[#run + 1] = i
  else
    flush_acks()
    settle_one(i)
  end
end
flush_acks()
if earliest then
  -- Every process's scheduler wakes at that time (a nack's due time; now after a release), and its
  -- receivers look again.
  redis.call('publish', KEYS[4], string.format('%d', earliest))
end
return results
"""))

EXTEND = Script("extend", with_prelude("""
-- KEYS[1] in-flight zset
-- ARGV[1] the message element (this delivery), ARGV[2] visibility timeout ms
-- returns: the new visibility deadline (server ms: now + timeout) if the delivery is still in
-- flight (not settled, not delivered again), else false. A resend sets a deadline a little later.
if not redis.call('zscore', KEYS[1], ARGV[1]) then return false end
local deadline = now_ms() + tonumber(ARGV[2])
redis.call('zadd', KEYS[1], 'XX', deadline, ARGV[1])
return deadline
"""))
