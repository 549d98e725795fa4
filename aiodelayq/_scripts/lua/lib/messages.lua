-- defines: MSG_MAGIC message first_delivery received release ack_deliveries
-- uses: lib/events.lua lib/groups.lua
-- Message elements (layout in aiodelayq/_wire/elements.py): 'adq' 0x02 | 16-byte id | '>I4' delivery
-- count | '>d' due ms of this delivery (0 = unknown: a first delivery) | payload. A message in flight
-- sits in the in-flight zset scored by its visibility deadline (server ms).
local MSG_MAGIC = 'adq' .. string.char(2)
local function message(id, count, due, payload)
  return MSG_MAGIC .. id .. struct.pack('>I4>d', count, due) .. payload
end
-- message(prefix .. '>I4' index, 1, 0, payload): the first delivery made as message `index` of the
-- RECEIVE whose call id starts with `prefix` (12 bytes), in one string (it runs per message).
local FIRST_DELIVERY = struct.pack('>I4>d', 1, 0)
local pack_ = struct.pack
local function first_delivery(prefix, index, payload)
  return MSG_MAGIC .. prefix .. pack_('>I4', index) .. FIRST_DELIVERY .. payload
end
-- Undo one delivery nobody saw: a first delivery goes back to the head of the destination (of the
-- groups' ready list, for a grouped one: lib/groups.lua), as if never received; a redelivery gets its
-- count lowered and is visible again at once.
local function release(K, m, now)
  local count, due = struct.unpack('>I4>d', m, 21)
  if count <= 1 then
    to_head(K, {string.sub(m, 33)}, true)
  else
    redis.call('zadd', K.in_flight, now, message(string.sub(m, 5, 20), count - 1, due, string.sub(m, 33)))
  end
  redis.call('zrem', K.in_flight, m)
  if events_on(K) then event_add(K, 'released', nil, string.sub(m, 5, 20), group_of(m, 33), count) end
end
-- The messages the RECEIVE of `call_id` returned, from its remembered record (deadline '>d' | the
-- 16-byte ids of its redeliveries): those in flight with that deadline whose id is in the record
-- or starts with the call id's first 12 bytes (its first deliveries, see first_delivery).
local function received(K, record, call_id)
  local out = {}
  if record and string.len(record) >= 8 then
    local deadline = struct.unpack('>d', record, 1)
    local ids, prefix = {}, string.sub(call_id, 1, 12)
    for p = 9, string.len(record), 16 do ids[string.sub(record, p, p + 15)] = true end
    for _, m in ipairs(redis.call('zrangebyscore', K.in_flight, deadline, deadline)) do
      if string.sub(m, 5, 16) == prefix or ids[string.sub(m, 5, 20)] then out[#out + 1] = m end
    end
  end
  return out
end
-- Remove the deliveries `members` (message elements) from flight, 1,000 per ZMSCORE and ZREM instead
-- of two calls each; returns, per member, whether it was in flight (the same member twice: the second
-- finds it gone, as one by one). ZREM counts a member given twice once: only when it removes fewer
-- than ZMSCORE found are the members told apart (a table of those seen, built for such calls alone).
local function ack_deliveries(K, members)
  local found = {}
  for c = 1, #members, 1000 do
    local last = math.min(c + 999, #members)
    local scores = redis.call('zmscore', K.in_flight, unpack(members, c, last))
    local n = 0
    for j = c, last do
      local f = scores[j - c + 1] ~= false
      found[j] = f
      if f then n = n + 1 end
    end
    if n > 0 and redis.call('zrem', K.in_flight, unpack(members, c, last)) < n then
      local seen = {}
      for j = c, last do
        if found[j] then
          found[j] = not seen[members[j]]
          seen[members[j]] = true
        end
      end
    end
  end
  if events_on(K) then
    for j = 1, #members do
      local m = members[j]
      if found[j] then event_add(K, 'acked', nil, string.sub(m, 5, 20), group_of(m, 33), (struct.unpack('>I4', m, 21))) end
    end
  end
  return found
end
