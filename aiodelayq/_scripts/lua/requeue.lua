-- REQUEUE: move dead letters back into the pending zset, once per call id.
-- KEYS: dead_letter timeout_set delay_list channel calls call_replies grouped controls event_stream
-- uses: lib/calls.lua lib/chunked.lua lib/clock.lua lib/dead.lua lib/events.lua lib/groups.lua lib/issue.lua lib/item.lua lib/parse.lua
-- ARGV[1] call id, ARGV[2] issue time (server ms as the client estimates it, '' = none), ARGV[3]
-- delay ms, ARGV[4] element kind ('fast', 'strict', 'legacy'), ARGV[5] at most this many entries,
-- ARGV[6] 16 bytes per entry (fast: insertion stamp | random; strict/legacy: random)
-- returns: {requeued, skipped}. The oldest entries (the head of the list) become pending items of
-- the queue's kind, due at the issue time + delay, in their order, without the expiry an item
-- envelope had (requeuing is a decision to deliver them); malformed entries (garbage
-- elements, not payloads, and anything that is not an envelope) are skipped: they move to the tail of
-- the list, in their order. A grouped item becomes a fast element of K.grouped whatever the kind
-- (lib/groups.lua: it waits for its turn again, behind its group's due items). A resend of the call id returns the first run's reply and changes nothing.
local first = first_run(K, ARGV[1])
if first then
  local r = redis.call('hget', K.call_replies, ARGV[1])
  return {tonumber(string.sub(r, 1, 10)), tonumber(string.sub(r, 11, 20))}
end
local now = now_ms()
local due = issue_base(ARGV[2], now) + tonumber(ARGV[3])
local kind, ids = ARGV[4], ARGV[6]
local entries = redis.call('lrange', K.dead_letter, 0, tonumber(ARGV[5]) - 1)
local zargs, gargs, listed, skipped = {}, {}, {}, {}
for i, e in ipairs(entries) do
  local raw, reason = e, DEAD_MALFORMED
  if string.sub(e, 1, 4) == DEAD_MAGIC and string.len(e) >= 17 then
    reason = string.byte(e, 5)
    if reason >= DEAD_MAX_DELIVERIES and reason <= DEAD_EXPIRED then
      raw = item_without_expiry(string.sub(e, 18))
    else
      reason = DEAD_MALFORMED
    end
  end
  if reason == DEAD_MALFORMED then
    skipped[#skipped + 1] = e
  else
    local id = string.sub(ids, 16 * i - 15, 16 * i)
    local v
    if events_on(K) then event_add(K, 'requeued', nil, nil, group_of(raw)) end
    if group_of(raw) then
      gargs[#gargs + 1] = due
      gargs[#gargs + 1] = struct.pack('Bc0Lc0', 20, FAST_MAGIC .. id, string.len(raw), raw)
    elseif kind == 'fast' then
      v = struct.pack('Bc0Lc0', 20, FAST_MAGIC .. id, string.len(raw), raw)
    elseif kind == 'strict' then
      v = struct.pack('Bc0Lc0', 8, string.sub(id, 1, 8), string.len(raw), raw)
    else
      v = struct.pack('dLc0', struct.unpack('>I4', id, 1) * 4294967296 + struct.unpack('>I4', id, 5),
                      string.len(raw), raw)
    end
    if v then
      zargs[#zargs + 1] = due
      zargs[#zargs + 1] = v
      if kind ~= 'fast' then listed[#listed + 1] = v end
    end
  end
end
if #entries > 0 then
  -- Writes first: under maxmemory the server refuses a script's first write, so nothing is
  -- trimmed unless the items are pending.
  local head = redis.call('zrange', K.timeout_set, 0, 0, 'WITHSCORES')
  chunked('zadd', K.timeout_set, 'NX', zargs)
  chunked('zadd', K.grouped, 'NX', gargs)
  chunked('rpush', K.delay_list, nil, listed)
  redis.call('ltrim', K.dead_letter, #entries, -1)
  chunked('rpush', K.dead_letter, nil, skipped)
  if #gargs > 0 or #zargs > 0 and (head[2] == nil or due < tonumber(head[2])) then
    redis.call('publish', K.channel, string.format('%d', due))
  end
end
local requeued = #entries - #skipped
remember(K, ARGV[1], now, string.format('%10d%10d', requeued, #skipped))
return {requeued, #skipped}
