-- SETTLE: ack, nack, dead-letter or release messages in flight.
-- KEYS: in_flight dead_letter destination channel calls call_replies controls nacked groups group_ready event_stream
-- uses: lib/calls.lua lib/clock.lua lib/controls.lua lib/dead.lua lib/events.lua lib/groups.lua lib/messages.lua lib/wake.lua
-- ARGV[1] max deliveries (0 = unlimited), ARGV[2] call id (16 bytes), ARGV[3] '' for a first attempt,
--         '1' for a resend after a lost reply, ARGV[4] how long after its first attempt the client may
--         still resend the call (ms)
-- then runs of settles that share a mode and a deadline, each: 'ack' | 'nack' | 'dead' (the payload
--         to the dead-letter list, reason nacked) | 'undecodable' (the same, reason undecodable) |
--         'release' (undo this delivery: nobody saw the message); the nack delay ms; the messages'
--         visibility deadline ms; the run's length n; then its n message elements. On a resend, a
--         message gone before its deadline can only have been settled by the first attempt (nobody
--         else touches it before then). After its deadline "gone" no longer says who settled it, so
--         a call that a resend may reach after one of its deadlines (within ARGV[4] of now)
--         remembers its reply by call id for CALL_WINDOW_MS, and a resend of it answers that reply
--         and writes nothing.
-- Settles are applied in order (releases of first deliveries are LPUSHed: send them last first).
-- A nack with a delay also enters the message in K.nacked until it is visible again: it waits, and
-- the concurrency limit does not count it. While a limit is set, a call that makes room in a full
-- one publishes now, so the consumers it held back look again. A grouped message that leaves flight
-- for good (acked, dead-lettered) lets its group admit its next item (lib/groups.lua), and a released
-- one goes back to the head of the ready list; when that fills an empty ready list (consumers found
-- nothing to hand out), the call publishes now too.
-- returns: per settle, 1 settled as asked; 2 a nack of the last allowed delivery dead-lettered it;
-- 0 the message was not in flight as this delivery (already settled, or redelivered after its deadline);
-- then 1 if it made room for consumers that found nothing (a group's next item, room in a full limit, a
-- release: it published now), else 0 (0 on a resend answered from its remembered reply).
local now = now_ms()
local max, id, resend, horizon = tonumber(ARGV[1]), ARGV[2], ARGV[3] ~= '', tonumber(ARGV[4])
if resend and first_run(K, id) then
  local answered = {}
  for result in string.gmatch(redis.call('hget', K.call_replies, id) or '', '%d+') do
    answered[#answered + 1] = tonumber(result)
  end
  answered[#answered + 1] = 0
  return answered
end
local results, earliest, remembered = {}, false, false
-- A message that leaves flight for good lets its group hand out the next (message_settled, applied by
-- groups_settle after each run of acks and after each other settle); admitted: groups admitted items to
-- an empty ready list.
local admitted = false
local cap = tonumber(redis.call('hget', K.controls, 'cap'))
local held = cap and held_messages(K, now)
-- Acks come in runs (a consumer's written-behind acks): consecutive ones go together (ack_deliveries).
-- The other modes go one by one, in order.
local acks, ack_deadlines, ack_slots = {}, {}, {}  -- each ack's element, deadline and result slot
local function flush_acks()
  local found = ack_deliveries(K, acks)
  for j = 1, #acks do
    results[ack_slots[j]] = (found[j] or (resend and now < ack_deadlines[j])) and 1 or 0
    if found[j] then message_settled(acks[j], 33) end
  end
  if groups_settle(K) then admitted = true end
  acks, ack_deadlines, ack_slots = {}, {}, {}
end
local function settle_one(m, mode, delay, deadline)
  local result = 1
  if not redis.call('zscore', K.in_flight, m) then
    if not (resend and now < deadline) then result = 0 end
  elseif mode == 'dead' or mode == 'undecodable' then
    local reason, count = mode == 'dead' and DEAD_NACKED or DEAD_UNDECODABLE, struct.unpack('>I4', m, 21)
    redis.call('rpush', K.dead_letter, dead_entry(reason, count, now, string.sub(m, 33)))
    redis.call('zrem', K.in_flight, m)
    if events_on(K) then event_add(K, 'dead_lettered', nil, string.sub(m, 5, 20), group_of(m, 33), count, reason) end
    message_settled(m, 33)
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
      message_settled(m, 33)
      result = 2
      if events_on(K) then
        event_add(K, 'dead_lettered', nil, string.sub(m, 5, 20), group_of(m, 33), count, DEAD_MAX_DELIVERIES)
      end
    else
      local due = now + delay
      redis.call('zadd', K.in_flight, 'XX', due, m)
      if delay > 0 then
        forget_ended_nacks(K, now)
        redis.call('zadd', K.nacked, due, m)
      end
      if not earliest or due < earliest then earliest = due end
      if events_on(K) then event_add(K, 'nacked', nil, string.sub(m, 5, 20), group_of(m, 33), count) end
    end
  end
  return result
end
local i, slot = 5, 0
while i <= #ARGV do
  local mode, delay, deadline, n = ARGV[i], tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2]), tonumber(ARGV[i + 3])
  if deadline <= now + horizon then remembered = true end
  for j = i + 4, i + 3 + n do
    slot = slot + 1
    if mode == 'ack' then
      local a = #acks + 1
      acks[a], ack_deadlines[a], ack_slots[a] = ARGV[j], deadline, slot
    else
      flush_acks()
      results[slot] = settle_one(ARGV[j], mode, delay, deadline)
      if groups_settle(K) then admitted = true end
    end
  end
  i = i + 4 + n
end
flush_acks()
if remembered then remember(K, id, now, table.concat(results, ',')) end
local room = admitted or cap and held >= cap and held_messages(K, now) < cap or earliest == now
if room then
  -- Room in a full limit, a group's next item, a release: consumers look again.
  wake_consumers(K, now)
end
if earliest and earliest ~= now then
  -- Every process's transfer task wakes at that time (a nack's due time), and its receivers look again.
  redis.call('publish', K.channel, string.format('%d', earliest))
end
results[#results + 1] = room and 1 or 0
return results
