"""Lua scripts: every write to the queue's keys, and every read that must parse packed elements.

Each script is a module constant whose header names its KEYS, ARGV and reply, wrapped in a
:class:`~aiodelayq._connections.Script` (text + SHA1, shared by every client of the process) and run
with :func:`~aiodelayq._connections.run_script`. Packing and unpacking happen inside Lua, as Redisson
does, so the server's own ``struct`` sizes are used (``L`` is 8 bytes on 64-bit Linux servers, 4 on
Windows builds).

Time is always the **server** clock (``TIME``): producers and consumers with skewed clocks still
agree on when an item is due.

Resends (see ``docs/design.md``, "Connections and resends"): the library never lets redis-py resend
a call; where it resends one itself after a lost reply, the script makes the resend harmless: OFFER,
RECEIVE and the pending walk's REMOVE_PAGE (in ``_pending.py``) carry a call id remembered for 60 s,
POP records its items under its call id in the hand-off, FINISH and TRANSFER are idempotent, SETTLE is
told it is a resend and the message's deadline, so it can tell "my first attempt applied it" from "it
went to someone else".
"""

from __future__ import annotations

from ._connections import Script

__all__ = [
    "FINISH",
    "NATIVE_LONG",
    "OFFER",
    "POP",
    "RECEIVE",
    "RELEASE_CALL",
    "SETTLE",
    "TRANSFER",
]

# Shared prelude. ``parse`` accepts every element kind and checks every length, so a legacy
# element is never read as a current one (or the reverse) and garbage is recognised as garbage:
#   current (Redisson >= 3.21.1): struct.pack('Bc0Lc0', 8, <8 random bytes>, #payload, payload)
#   legacy  (Redisson <  3.21.1): struct.pack('dLc0', <random double>, #payload, payload)
#   fast    (aiodelayq, not in the list): struct.pack('Bc0Lc0', 20, <id>, #payload, payload) with
#           id = 'adq' 0x01 | 8-byte big-endian insertion stamp (µs) | 8 random bytes.
#           Redisson's own unpack('Bc0Lc0') reads it like any other element.
# An element that satisfies both the current and the legacy layout needs a legacy double whose
# first byte is 0x08 *and* a one-byte payload "\0"; it is read as the current format.
# ``parse`` returns the payload (or nil) and whether the element is a fast one (kept out of the
# insertion-order list, so nothing has to be removed from that list when it moves).
_PRELUDE = """
local LSZ = string.len(struct.pack('L', 0))
local FAST_MAGIC = 'adq' .. string.char(1)
local function parse(v)
  local n = string.len(v)
  local b0 = string.byte(v, 1)
  if b0 == 8 and n >= 9 + LSZ then
    local len = struct.unpack('L', v, 10)
    if len == n - 9 - LSZ then return string.sub(v, 10 + LSZ), false end
  end
  if b0 == 20 and n >= 21 + LSZ and string.sub(v, 2, 5) == FAST_MAGIC then
    local len = struct.unpack('L', v, 22)
    if len == n - 21 - LSZ then return string.sub(v, 22 + LSZ), true end
  end
  if n >= 8 + LSZ then
    local len = struct.unpack('L', v, 9)
    if len == n - 8 - LSZ then return string.sub(v, 9 + LSZ), false end
  end
  return nil, false
end
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000), t
end
-- Pushes a list of values in chunks (Lua's unpack has a stack limit). 'lpush' of a reversed list
-- puts the values at the head in their original order.
local function push_all(cmd, key, values)
  for i = 1, #values, 1000 do redis.call(cmd, key, unpack(values, i, math.min(i + 999, #values))) end
end
local function reversed(values)
  local out = {}
  for i = #values, 1, -1 do out[#out + 1] = values[i] end
  return out
end
-- A list of strings as one string: each '>I4' length-prefixed (hand-off entries).
local function pack_list(values)
  local parts = {}
  for i, v in ipairs(values) do parts[i] = struct.pack('>I4', string.len(v)) .. v end
  return table.concat(parts)
end
local function unpack_list(blob)
  local out, pos, n = {}, 1, string.len(blob)
  while pos + 3 <= n do
    local len = struct.unpack('>I4', blob, pos)
    out[#out + 1] = string.sub(blob, pos + 4, pos + 3 + len)
    pos = pos + 4 + len
  end
  return out
end
-- Call ids: 16 random bytes the client picks per logical call and sends again with every resend.
-- A call that carries one is remembered for CALL_WINDOW_MS (zset 'calls' scored by its first run,
-- optional reply in the hash 'replies'), so a resend within the window is not applied twice.
-- Clients stop resending a call CALL_WINDOW_MS / 2 after they first sent it.
local CALL_WINDOW_MS = 60000
local function first_run(calls, id)
  local at = redis.call('zscore', calls, id)
  return at and tonumber(at) or nil
end
local function remember(calls, replies, id, now, reply)
  redis.call('zadd', calls, now, id)
  if reply ~= nil then redis.call('hset', replies, id, reply) end
  -- Prune a bounded number of expired ids per call: the set stays as large as one window.
  local old = redis.call('zrangebyscore', calls, '-inf', now - CALL_WINDOW_MS, 'LIMIT', 0, 100)
  if #old > 0 then
    redis.call('zrem', calls, unpack(old))
    redis.call('hdel', replies, unpack(old))
  end
end
"""

_OFFER = _PRELUDE + """
-- KEYS[1] destination list (names the cluster slot), KEYS[2] timeout zset, KEYS[3] delay list,
-- KEYS[4] channel, KEYS[5] calls zset, KEYS[6] call replies hash
-- ARGV[1] call id (16 bytes), ARGV[2] element kind:
--   'packed': fast elements packed by the client (with this server's 'L' size), all in one
--             argument so the client does not pack thousands of arguments: ARGV[3] = concatenated
--             struct.pack('>dI4c0', delay ms, element), ARGV[4] = their count; zset only.
--   'current' (Redisson >= 3.21.1, 8-byte id) or 'legacy' (dLc0): ARGV[3..] triples of delay ms,
--             id (current: 8 random bytes; legacy: a decimal long), payload; zset + list.
-- returns: {now}: the server time (ms) of the call's first run; each item is due at now + its delay.
-- A resend of the same call id within the window writes nothing and returns the first run's now.
-- Publishes the earliest new due time when it is earlier than the previous zset head, so every
-- scheduler re-arms (Redisson publishes when the new element becomes the head).
local first = first_run(KEYS[5], ARGV[1])
if first then return {first} end
local now = now_ms()
local head = redis.call('zrange', KEYS[2], 0, 0, 'WITHSCORES')
local old = head[2] and tonumber(head[2]) or nil
local kind = ARGV[2]
local earliest = nil
if kind == 'packed' then
  local blob, count, pos = ARGV[3], tonumber(ARGV[4]), 1
  local zargs = {}
  for _ = 1, count do
    local d, element
    d, element, pos = struct.unpack('>dI4c0', blob, pos)
    zargs[#zargs + 1] = now + d
    zargs[#zargs + 1] = element
    if earliest == nil or now + d < earliest then earliest = now + d end
    if #zargs >= 1000 then
      redis.call('zadd', KEYS[2], 'NX', unpack(zargs))
      zargs = {}
    end
  end
  if #zargs > 0 then redis.call('zadd', KEYS[2], 'NX', unpack(zargs)) end
else
  for i = 3, #ARGV, 3 do
    local due = now + tonumber(ARGV[i])
    local payload = ARGV[i + 2]
    local value
    if kind == 'legacy' then
      value = struct.pack('dLc0', tonumber(ARGV[i + 1]), string.len(payload), payload)
    else
      value = struct.pack('Bc0Lc0', string.len(ARGV[i + 1]), ARGV[i + 1], string.len(payload), payload)
    end
    if redis.call('zadd', KEYS[2], 'NX', due, value) == 1 then
      redis.call('rpush', KEYS[3], value)
      if earliest == nil or due < earliest then earliest = due end
    end
  end
end
if earliest ~= nil and (old == nil or earliest < old) then
  redis.call('publish', KEYS[4], string.format('%d', earliest))
end
remember(KEYS[5], KEYS[6], ARGV[1], now, nil)
return {now}
"""
OFFER = Script("offer", _OFFER)

_TRANSFER = _PRELUDE + """
-- KEYS[1] destination list, KEYS[2] timeout zset, KEYS[3] delay list, KEYS[4] dead-letter list,
-- KEYS[5] hand-off hash, KEYS[6] hand-off leases zset
-- ARGV[1] at most this many elements are moved
-- returns: {moved, dead_lettered, next due score (epoch ms, text) or false, TIME seconds,
--           TIME micros, recovered, earliest hand-off lease deadline (ms, text) or false,
--           length of the destination list (consumers need not look when it is 0)}
-- Moves due elements (score <= now, server clock) in due order: the payload goes to the
-- destination; an element that is not a valid packed element goes, as it was, to the dead-letter
-- list, so one bad element can never stall the queue. Only elements that are in the insertion-
-- order list (Redisson's, strict mode's, malformed ones) are LREMed from it: O(list) each. Fast
-- elements cost O(log N).
-- Then hand-off entries whose lease ran out (their consumer died, or was cut off longer than the
-- lease) go back to the head of the destination, in their order: "recovered".
local now, t = now_ms()
local due = redis.call('zrangebyscore', KEYS[2], '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
local out, bad, listed = {}, {}, {}
for _, v in ipairs(due) do
  local payload, fast = parse(v)
  if payload then out[#out + 1] = payload else bad[#bad + 1] = v end
  if not fast then listed[#listed + 1] = v end
end
-- Pushes first: under maxmemory the server refuses a script's *first* write, so nothing may be
-- removed before the items are safely in the destination (a script error does not roll back).
push_all('rpush', KEYS[1], out)
push_all('rpush', KEYS[4], bad)
for _, v in ipairs(listed) do redis.call('lrem', KEYS[3], 1, v) end
for i = 1, #due, 1000 do
  redis.call('zrem', KEYS[2], unpack(due, i, math.min(i + 999, #due)))
end
local recovered = 0
for _, id in ipairs(redis.call('zrangebyscore', KEYS[6], '-inf', now, 'LIMIT', 0, 100)) do
  local blob = redis.call('hget', KEYS[5], id)
  if blob and blob ~= '' then
    local items = unpack_list(blob)
    push_all('lpush', KEYS[1], reversed(items))
    recovered = recovered + #items
  end
  redis.call('hdel', KEYS[5], id)
  redis.call('zrem', KEYS[6], id)
end
local nxt = redis.call('zrange', KEYS[2], 0, 0, 'WITHSCORES')
local lease = redis.call('zrange', KEYS[6], 0, 0, 'WITHSCORES')
return {#out, #bad, nxt[2] or false, t[1], t[2], recovered, lease[2] or false, redis.call('llen', KEYS[1])}
"""
TRANSFER = Script("transfer", _TRANSFER)

_POP = _PRELUDE + """
-- KEYS[1] destination list, KEYS[2] hand-off hash, KEYS[3] hand-off leases zset
-- ARGV[1] call id (16 bytes), ARGV[2] at most this many items, ARGV[3] lease ms
-- returns: the popped payloads, head first. They are recorded in the hand-off under the call id
-- until FINISH says what became of them; if FINISH never comes (the process died, or was cut off),
-- TRANSFER returns them to the head of the destination once the lease ends. A resend of the same
-- call id returns the same items (or none, after a FINISH '*' that overtook it).
local got = redis.call('hget', KEYS[2], ARGV[1])
if got then return unpack_list(got) end
local items = redis.call('lpop', KEYS[1], tonumber(ARGV[2]))
if not items then return {} end
local now = now_ms()
redis.call('hset', KEYS[2], ARGV[1], pack_list(items))
redis.call('zadd', KEYS[3], now + tonumber(ARGV[3]), ARGV[1])
return items
"""
POP = Script("pop", _POP)

_FINISH = _PRELUDE + """
-- KEYS[1] destination list, KEYS[2] hand-off hash, KEYS[3] hand-off leases zset,
-- KEYS[4] dead-letter list, KEYS[5] channel
-- ARGV[1] pop call id, ARGV[2] plan: one letter per popped item, in order: 'd' handed to a caller
--         (forget it), 'x' undecodable (to the dead-letter list), 'r' nobody took it (back to the
--         head of the destination); or '*': return them all (the pop's reply never came).
-- ARGV[3] lease ms (for the tombstone below)
-- returns: how many items the plan was applied to; 0 if the entry was already finished (a resend).
-- A '*' that finds no entry leaves an empty one (a tombstone, cleared when its lease ends): the
-- pop may still be on its way on a dropped connection, and must then pop nothing.
local blob = redis.call('hget', KEYS[2], ARGV[1])
if not blob then
  if ARGV[2] == '*' then
    local now = now_ms()
    redis.call('hset', KEYS[2], ARGV[1], '')
    redis.call('zadd', KEYS[3], now + tonumber(ARGV[3]), ARGV[1])
  end
  return 0
end
if blob == '' then return 0 end
local items = unpack_list(blob)
local back, dead = {}, {}
for i, v in ipairs(items) do
  local c = ARGV[2] == '*' and 'r' or string.sub(ARGV[2], i, i)
  if c == 'x' then dead[#dead + 1] = v elseif c ~= 'd' then back[#back + 1] = v end
end
push_all('lpush', KEYS[1], reversed(back))
push_all('rpush', KEYS[4], dead)
redis.call('hdel', KEYS[2], ARGV[1])
redis.call('zrem', KEYS[3], ARGV[1])
if #back > 0 then
  -- Wakes every scheduler of the queue, whose consumers then look at the destination again.
  redis.call('publish', KEYS[5], string.format('%d', now_ms()))
end
return #items
"""
FINISH = Script("finish", _FINISH)


NATIVE_LONG = Script("native_long", """
-- returns: struct.pack('L', 1): the size and byte order of the server's native unsigned long
return struct.pack('L', 1)
""")

# Reliable consumption. A message element is 'adq' 0x02 | 16-byte id | '>I4' delivery count |
# '>d' due ms of this delivery (0 = unknown: a first delivery) | payload. In flight it sits in the
# in-flight zset scored by its visibility deadline (server ms).
_MESSAGE_PRELUDE = _PRELUDE + """
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

_RECEIVE = _MESSAGE_PRELUDE + """
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
      redis.call('rpush', KEYS[3], e)
      dead = dead + 1
    elseif max > 0 and count >= max then
      redis.call('rpush', KEYS[3], string.sub(e, 33))
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
      local prefix = string.sub(ARGV[4], 1, 12)
      for i, payload in ipairs(fresh) do
        local m = message(prefix .. struct.pack('>I4', i), 1, 0, payload)
        redis.call('zadd', KEYS[2], now + vt, m)
        out[#out + 1] = m
      end
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
"""
RECEIVE = Script("receive", _RECEIVE)

_RELEASE_CALL = _MESSAGE_PRELUDE + """
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
"""
RELEASE_CALL = Script("release_call", _RELEASE_CALL)

_SETTLE = _MESSAGE_PRELUDE + """
-- KEYS[1] in-flight zset, KEYS[2] dead-letter list, KEYS[3] destination list, KEYS[4] channel
-- ARGV[1] message element, ARGV[2] 'ack' | 'nack' | 'dead' (its payload to the dead-letter list) |
--         'release' (undo this delivery: a receiver cancelled before it saw the message)
-- ARGV[3] nack delay ms, ARGV[4] max deliveries (0 = unlimited)
-- ARGV[5] '' for a first attempt; for a resend after a lost reply, the message's visibility
--         deadline (ms): a message gone before its deadline can only have been settled by the
--         first attempt (nobody else touches it before then)
-- returns: 1 settled as asked; 2 a nack of the last allowed delivery dead-lettered it; 0 the
-- message was not in flight as this delivery (already settled, or redelivered after its deadline).
local now = now_ms()
if not redis.call('zscore', KEYS[1], ARGV[1]) then
  if ARGV[5] ~= '' and now < tonumber(ARGV[5]) then return 1 end
  return 0
end
local mode = ARGV[2]
if mode == 'ack' then
  redis.call('zrem', KEYS[1], ARGV[1])
elseif mode == 'dead' then
  redis.call('rpush', KEYS[2], string.sub(ARGV[1], 33))
  redis.call('zrem', KEYS[1], ARGV[1])
elseif mode == 'release' then
  release(KEYS[1], KEYS[3], ARGV[1], now)
else
  local count = struct.unpack('>I4', ARGV[1], 21)
  local max = tonumber(ARGV[4])
  if max > 0 and count >= max then
    -- No delivery is left: dead-letter it now instead of leaving it in flight until a receive.
    redis.call('rpush', KEYS[2], string.sub(ARGV[1], 33))
    redis.call('zrem', KEYS[1], ARGV[1])
    return 2
  end
  local due = now + tonumber(ARGV[3])
  redis.call('zadd', KEYS[1], 'XX', due, ARGV[1])
  -- Every process's scheduler wakes at that time, and its receivers look again.
  redis.call('publish', KEYS[4], string.format('%d', due))
end
return 1
"""
SETTLE = Script("settle", _SETTLE)
