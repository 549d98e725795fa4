-- RECEIVE: pop ready items into the in-flight zset as messages, once per call id.
-- KEYS: destination in_flight dead_letter calls call_replies controls timeout_set delay_list key_index channel schedules nacked groups group_ready event_stream
-- uses: lib/calls.lua lib/chunked.lua lib/clock.lua lib/controls.lua lib/dead.lua lib/events.lua lib/groups.lua lib/hand_out.lua lib/item.lua lib/messages.lua lib/wake.lua
-- ARGV[1] at most this many messages, ARGV[2] visibility timeout ms, ARGV[3] max deliveries
-- (0 = unlimited), ARGV[4] call id (16 random bytes; fresh message ids are its first 12 bytes and
-- a 4-byte index), ARGV[5...] message elements this consumer acked, written behind: removed from
-- flight first, as SETTLE's acks (they ride on the call instead of a SETTLE call of their own)
-- returns: {now ms (a resend: the first run's), earliest in-flight deadline (ms, text) or false,
--           dead-lettered count (past max deliveries), hold, expired count, malformed count,
--           acks applied (-1 on a resend: the first run applied them), {messages}, capped (1 while
--           a concurrency limit is set, else 0; 0 on a resend)}; hold as POP's: 0, -1 while the
--           queue is paused (nothing received), or the ms until the rate limit lets one more message
--           out, and HOLD_CAPPED (-2) when the concurrency limit leaves no room (nothing received:
--           an ack, a nack or the next deadline makes some). expired: items whose envelope's
--           expiry had passed when they were due for a delivery, moved to the dead-letter list
--           (reason expired) instead. malformed: in-flight entries that are not message elements
--           (someone else's garbage), moved there as they were. Each of the three counts takes its
--           share of ARGV[1]: a call that returns no message but counts some has more to do. The first delivery of an occurrence of a recurring item
--           schedules its next occurrence (lib/hand_out.lua).
-- Messages whose visibility deadline passed are delivered again first (count + 1; past the limit
-- their payload goes to the dead-letter list instead); then fresh payloads are popped from the
-- destination and the groups' ready list (lib/groups.lua: admitted items, each counted in its group
-- until it is settled; while the ready list has some it gets half of the fresh ones, for one
-- message every other millisecond, and either list gives what the other leaves). Every message
-- returned is already in flight: a reply lost on the way, or a consumer
-- that dies, only delays it until its deadline. A resend of the call id returns the same messages
-- (those still in flight as that delivery), without popping or counting anything.
local now = now_ms()
local limit, vt, max = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local out, dead, hold, lapsed, garbage = {}, 0, 0, 0, 0
local cap  -- the concurrency limit, if one is set (read with the other controls)
local admitted  -- groups admitted items to an empty ready list: consumers elsewhere look
-- The remembered record: the deadline, then the ids of the redeliveries (see received()).
local ids = {struct.pack('>d', now + vt)}
local first = first_run(K, ARGV[4])
local acked = -1
if first then
  out = received(K, redis.call('hget', K.call_replies, ARGV[4]), ARGV[4])
  -- Reply with the first run's time: the client computes each message's deadline from it.
  now = first
else
  acked = 0
  -- With an ack of a grouped message among them, each is found (ack_deliveries), so that it leaves
  -- its group's flight (lib/groups.lua), and so while events are on; else they are removed in
  -- batches, unread.
  local one_by_one = #ARGV >= 5 and events_on(K)
  for c = 5, one_by_one and 0 or #ARGV do
    if string.byte(ARGV[c], 33) == ITEM_BYTE and group_of(ARGV[c], 33) then
      one_by_one = true
      break
    end
  end
  if one_by_one then
    local acks = {}
    for c = 5, #ARGV do acks[c - 4] = ARGV[c] end
    for j, found in ipairs(ack_deliveries(K, acks)) do
      if found then
        acked = acked + 1
        message_settled(acks[j], 33)
      end
    end
  else
    for c = 5, #ARGV, 1000 do  -- (ZREM counts a member given twice once)
      acked = acked + redis.call('zrem', K.in_flight, unpack(ARGV, c, math.min(c + 999, #ARGV)))
    end
  end
  local level, held, _
  limit, hold, level, _, cap = controls_allow(K, limit, now)
  if cap then  -- the concurrency limit: room for cap - held more (the acks above made some)
    held = held_messages(K, now)
    if limit > cap - held then
      limit = math.max(0, cap - held)
      if limit == 0 and hold == 0 then hold = HOLD_CAPPED end
    end
  end
  local expired = limit > 0 and redis.call('zrangebyscore', K.in_flight, '-inf', now, 'LIMIT', 0, limit) or {}
  for _, e in ipairs(expired) do
    local valid = string.len(e) >= 32 and string.sub(e, 1, 4) == MSG_MAGIC
    local count = valid and struct.unpack('>I4', e, 21) or 0
    if not valid then
      -- Not a message element (someone else's garbage): moved aside as it was, never a stall.
      redis.call('rpush', K.dead_letter, dead_entry(DEAD_MALFORMED, 0, now, e))
      event_add(K, 'dead_lettered', nil, nil, nil, 0, DEAD_MALFORMED)
      garbage = garbage + 1
    elseif max > 0 and count >= max then
      redis.call('rpush', K.dead_letter, dead_entry(DEAD_MAX_DELIVERIES, count, now, string.sub(e, 33)))
      dead = dead + 1
      message_settled(e, 33)
      if events_on(K) then
        event_add(K, 'dead_lettered', nil, string.sub(e, 5, 20), group_of(e, 33), count, DEAD_MAX_DELIVERIES)
      end
    else
      local payload = string.sub(e, 33)
      if string.byte(payload, 1) == ITEM_BYTE then payload = hand_out(K, payload, count, now) end
      if payload then
        local became_due = tonumber(redis.call('zscore', K.in_flight, e))
        local id = string.sub(e, 5, 20)
        local m = message(id, count + 1, became_due, payload)
        redis.call('zadd', K.in_flight, now + vt, m)
        out[#out + 1] = m
        ids[#ids + 1] = id
      else
        lapsed = lapsed + 1
        message_settled(e, 33)
      end
    end
    redis.call('zrem', K.in_flight, e)
  end
  -- The groups of the messages acked or gone above may hand out their next ones below.
  admitted = groups_settle(K)
  local want = limit - #out - dead - lapsed - garbage
  if want > 0 then
    -- The deadline as text once: ZADD would format the number again for every member.
    local prefix, deadline, scored = string.sub(ARGV[4], 1, 12), string.format('%d', now + vt), {}
    local n, o, index, byte_ = 0, #out, 0, string.byte  -- counted: the loop is per message
    -- Fresh payloads become first deliveries (ids: the call id's prefix and a running index); a
    -- grouped one that lapses leaves its group's flight (`counted`).
    local function deliver(fresh, counted)
      for i = 1, #fresh do
        local payload = fresh[i]
        if byte_(payload, 1) == ITEM_BYTE then payload = hand_out(K, payload, 0, now) end
        if payload then
          local m = first_delivery(prefix, index + i, payload)
          scored[n + 1], scored[n + 2] = deadline, m
          n, o = n + 2, o + 1
          out[o] = m
        else
          lapsed = lapsed + 1
          if counted then message_settled(fresh[i], 1) end
        end
      end
      index = index + #fresh
    end
    local share = groups_share(K, want, now)
    if want > share then deliver(redis.call('lpop', K.destination, want - share) or {}, false) end
    if index < want then deliver(groups_hand_out(K, want - index, true), true) end
    if share > 0 and index < want then deliver(redis.call('lpop', K.destination, want - index) or {}, false) end
    -- One ZADD per 500 messages, not one per message: a receive of 100 cost 4.3 us of server
    -- time per message with a call each.
    chunked('zadd', K.in_flight, nil, scored)
  end
  if groups_settle(K) then admitted = true end  -- (grouped payloads that lapsed)
  -- Consumers elsewhere look again only for the admitted items this call left.
  if admitted and redis.call('llen', K.group_ready) > 0 then
    wake_consumers(K, now)
  end
  controls_charge(K, now, level, #out)
  if #out > 0 and events_on(K) then
    for _, m in ipairs(out) do
      event_add(K, 'delivered', nil, string.sub(m, 5, 20), group_of(m, 33), (struct.unpack('>I4', m, 21)))
    end
  end
  if cap and acked > 0 and held + acked >= cap and held + #out < cap then
    -- Its acks made room that it leaves: consumers the limit held back, here or elsewhere, look again.
    wake_consumers(K, now)
  end
  -- (remembered with acks too: a resend must not count them again)
  if #out > 0 or acked > 0 then remember(K, ARGV[4], now, table.concat(ids)) end
end
local head = redis.call('zrange', K.in_flight, 0, 0, 'WITHSCORES')
return {now, head[2] or false, dead, hold, lapsed, garbage, acked, out, cap and 1 or 0}
