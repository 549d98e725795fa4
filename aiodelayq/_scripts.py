"""Lua scripts: every write to the queue's keys, and every read that must parse packed elements.

Each script is a module constant whose header names its KEYS, ARGV and reply. They are registered
once per client (:func:`scripts_for`) and run with ``EVALSHA`` (redis-py loads them on
``NOSCRIPT``). Packing and unpacking happen inside Lua, as Redisson does, so the server's own
``struct`` sizes are used (``L`` is 8 bytes on 64-bit Linux servers, 4 on Windows builds).

Time is always the **server** clock (``TIME``): producers and consumers with skewed clocks still
agree on when an item is due.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis

__all__ = ["Scripts", "scripts_for"]

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
-- Calls fn(element) for every element of a list or zset, 1000 at a time (in list order / score
-- order); stops when fn returns true. count and range are the type's commands (llen/lrange or
-- zcard/zrange).
local function each(key, count, range, fn)
  local n = redis.call(count, key)
  for start = 0, n - 1, 1000 do
    for _, v in ipairs(redis.call(range, key, start, start + 999)) do
      if fn(v) then return end
    end
  end
end
local function each_entry(key, fn) each(key, 'llen', 'lrange', fn) end
local function each_member(key, fn) each(key, 'zcard', 'zrange', fn) end
"""

OFFER = _PRELUDE + """
-- KEYS[1] destination list (names the cluster slot), KEYS[2] timeout zset, KEYS[3] delay list,
-- KEYS[4] channel
-- ARGV[1] element kind: 'packed' (see below), 'fast' (current layout, 20-byte id, zset only), 'current' (Redisson
--         >= 3.21.1, 8-byte id, zset + list), 'legacy' (dLc0, zset + list)
-- ARGV[2..] triples: delay in ms (integer >= 0), id (fast: 20 bytes; current: 8 random bytes;
--           legacy: a decimal long), payload
-- returns: the due time of each item in epoch ms (server clock), in argument order.
-- Publishes the earliest new due time when it is earlier than the previous zset head, so every
-- scheduler re-arms (Redisson publishes when the new element becomes the head).
local now = now_ms()
local head = redis.call('zrange', KEYS[2], 0, 0, 'WITHSCORES')
local old = head[2] and tonumber(head[2]) or nil
local kind = ARGV[1]
if kind == 'packed' then
  -- Fast elements packed by the client (with this server's 'L' size), all in one argument so the
  -- client does not pack thousands of arguments: ARGV[2] = concatenated struct.pack('>dI4c0',
  -- delay ms, element), ARGV[3] = their count. One ZADD NX per 500 elements. returns {now} when
  -- every element was new (due = now + delay), else {now, due of each element} (a resent script
  -- found some already there).
  local blob, count, pos = ARGV[2], tonumber(ARGV[3]), 1
  local added, mind, zargs, elements = 0, nil, {}, {}
  for _ = 1, count do
    local d, element
    d, element, pos = struct.unpack('>dI4c0', blob, pos)
    zargs[#zargs + 1] = now + d
    zargs[#zargs + 1] = element
    elements[#elements + 1] = element
    if mind == nil or d < mind then mind = d end
    if #zargs >= 1000 then
      added = added + redis.call('zadd', KEYS[2], 'NX', unpack(zargs))
      zargs = {}
    end
  end
  if #zargs > 0 then added = added + redis.call('zadd', KEYS[2], 'NX', unpack(zargs)) end
  local result = {now}
  if added < count then
    for _, element in ipairs(elements) do result[#result + 1] = tonumber(redis.call('zscore', KEYS[2], element)) end
  end
  if mind ~= nil and (old == nil or now + mind < old) then
    redis.call('publish', KEYS[4], string.format('%d', now + mind))
  end
  return result
end
local dues = {}
local earliest = nil
for i = 2, #ARGV, 3 do
  local due = now + tonumber(ARGV[i])
  local payload = ARGV[i + 2]
  local value
  if kind == 'legacy' then
    value = struct.pack('dLc0', tonumber(ARGV[i + 1]), string.len(payload), payload)
  else
    value = struct.pack('Bc0Lc0', string.len(ARGV[i + 1]), ARGV[i + 1], string.len(payload), payload)
  end
  -- A client library may resend this script when its reply was lost: the same id then finds its
  -- element already there, and nothing is written twice.
  if redis.call('zadd', KEYS[2], 'NX', due, value) == 1 then
    if kind ~= 'fast' then redis.call('rpush', KEYS[3], value) end
    dues[#dues + 1] = due
    if earliest == nil or due < earliest then earliest = due end
  else
    dues[#dues + 1] = tonumber(redis.call('zscore', KEYS[2], value))
  end
end
if earliest ~= nil and (old == nil or earliest < old) then
  redis.call('publish', KEYS[4], string.format('%d', earliest))
end
return dues
"""

TRANSFER = _PRELUDE + """
-- KEYS[1] destination list, KEYS[2] timeout zset, KEYS[3] delay list, KEYS[4] dead-letter list
-- ARGV[1] at most this many elements are moved
-- returns: {moved, dead_lettered, next due score (epoch ms, text) or nil, TIME seconds, TIME micros}
-- Moves due elements (score <= now, server clock) in due order: the payload goes to the
-- destination; an element that is not a valid packed element goes, as it was, to the dead-letter
-- list, so one bad element can never stall the queue. Only elements that are in the insertion-
-- order list (Redisson's, strict mode's, malformed ones) are LREMed from it: O(list) each. Fast
-- elements cost O(log N).
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
for i = 1, #out, 1000 do
  redis.call('rpush', KEYS[1], unpack(out, i, math.min(i + 999, #out)))
end
for i = 1, #bad, 1000 do
  redis.call('rpush', KEYS[4], unpack(bad, i, math.min(i + 999, #bad)))
end
for _, v in ipairs(listed) do redis.call('lrem', KEYS[3], 1, v) end
for i = 1, #due, 1000 do
  redis.call('zrem', KEYS[2], unpack(due, i, math.min(i + 999, #due)))
end
local moved, dead = #out, #bad
local nxt = redis.call('zrange', KEYS[2], 0, 0, 'WITHSCORES')
return {moved, dead, nxt[2] or false, t[1], t[2]}
"""

READ_ALL = _PRELUDE + """
-- KEYS[1] delay list, KEYS[2] timeout zset
-- returns: the payloads of the pending elements: first those in the insertion-order list (in list
-- order), then fast elements ordered by their insertion stamp. Malformed elements are skipped.
local result = {}
each_entry(KEYS[1], function(v)
  local payload = parse(v)
  if payload then result[#result + 1] = payload end
end)
local fast = {}
each_member(KEYS[2], function(v)
  local payload, is_fast = parse(v)
  if is_fast then fast[#fast + 1] = v end
end)
-- The stamp (bytes 6..13, big-endian) then the random part sort as plain strings.
table.sort(fast, function(a, b) return string.sub(a, 6, 21) < string.sub(b, 6, 21) end)
for _, v in ipairs(fast) do result[#result + 1] = (parse(v)) end
return result
"""

CONTAINS = _PRELUDE + """
-- KEYS[1] delay list, KEYS[2] timeout zset
-- ARGV[1] payload
-- returns: 1 if a pending element carries this payload, else 0
local found = 0
each_entry(KEYS[1], function(v)
  if parse(v) == ARGV[1] then found = 1; return true end
end)
if found == 0 then
  each_member(KEYS[2], function(v)
    local payload, is_fast = parse(v)
    if is_fast and payload == ARGV[1] then found = 1; return true end
  end)
end
return found
"""

REMOVE = _PRELUDE + """
-- KEYS[1] delay list, KEYS[2] timeout zset
-- ARGV[1] '1' = remove only the first match, '0' = every match
-- ARGV[2..] payloads
-- returns: how many pending elements were removed.
-- "First" is insertion order as read_all() reports it: list entries first, then fast elements by
-- stamp. List entries are removed from the zset and the list (as Redisson's remove does).
local wanted = {}
for i = 2, #ARGV do wanted[ARGV[i]] = true end
local first_only = ARGV[1] == '1'
local listed = {}
each_entry(KEYS[1], function(v)
  local payload = parse(v)
  if payload and wanted[payload] then
    listed[#listed + 1] = v
    return first_only
  end
end)
local fast = {}
if not (first_only and #listed > 0) then
  each_member(KEYS[2], function(v)
    local payload, is_fast = parse(v)
    if is_fast and wanted[payload] then fast[#fast + 1] = v end
  end)
  if first_only and #fast > 1 then
    table.sort(fast, function(a, b) return string.sub(a, 6, 21) < string.sub(b, 6, 21) end)
    fast = {fast[1]}
  end
end
for _, v in ipairs(listed) do
  redis.call('zrem', KEYS[2], v)
  redis.call('lrem', KEYS[1], 1, v)
end
for i = 1, #fast, 1000 do
  redis.call('zrem', KEYS[2], unpack(fast, i, math.min(i + 999, #fast)))
end
return #listed + #fast
"""


NATIVE_LONG = """
-- returns: struct.pack('L', 1): the size and byte order of the server's native unsigned long
return struct.pack('L', 1)
"""


@dataclass(frozen=True)
class Scripts:
    """The scripts registered on one client (``EVALSHA`` with a ``SCRIPT LOAD`` fallback)."""

    offer: Any
    transfer: Any
    read_all: Any
    contains: Any
    remove: Any
    native_long: Any
    receive: Any
    settle: Any


_registered: weakref.WeakKeyDictionary[Redis, Scripts] = weakref.WeakKeyDictionary()


def scripts_for(client: Redis) -> Scripts:
    """Return the scripts registered on ``client``, registering them on first use."""
    scripts = _registered.get(client)
    if scripts is None:
        scripts = Scripts(
            offer=client.register_script(OFFER),
            transfer=client.register_script(TRANSFER),
            read_all=client.register_script(READ_ALL),
            contains=client.register_script(CONTAINS),
            remove=client.register_script(REMOVE),
            native_long=client.register_script(NATIVE_LONG),
            receive=client.register_script(RECEIVE),
            settle=client.register_script(SETTLE),
        )
        _registered[client] = scripts
    return scripts


# Reliable consumption. A message element is 'adq' 0x02 | 16-byte id | '>I4' delivery count |
# '>d' due ms of this delivery (0 = unknown: a first delivery) | payload. In flight it sits in the
# in-flight zset scored by its visibility deadline (server ms).
_MESSAGE_PRELUDE = """
local MSG_MAGIC = 'adq' .. string.char(2)
local function message(id, count, due, payload)
  return MSG_MAGIC .. id .. struct.pack('>I4>d', count, due) .. payload
end
"""

RECEIVE = _MESSAGE_PRELUDE + """
-- KEYS[1] destination list, KEYS[2] in-flight zset, KEYS[3] dead-letter list
-- ARGV[1] at most this many messages, ARGV[2] visibility timeout ms, ARGV[3] max deliveries
-- (0 = unlimited), ARGV[4] fresh ids: ARGV[1] x 16 random bytes
-- returns: {now ms, earliest in-flight deadline (ms, text) or false, dead-lettered count, messages...}
-- Messages whose visibility deadline passed are delivered again first (count + 1; past the limit
-- their payload goes to the dead-letter list instead); then fresh payloads are popped from the
-- destination. Every message returned is already in flight: a reply lost on the way, or a consumer
-- that dies, only delays it until its deadline.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local limit, vt, max = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local out, dead = {}, 0
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
    for i, payload in ipairs(fresh) do
      local m = message(string.sub(ARGV[4], 16 * i - 15, 16 * i), 1, 0, payload)
      redis.call('zadd', KEYS[2], now + vt, m)
      out[#out + 1] = m
    end
  end
end
local head = redis.call('zrange', KEYS[2], 0, 0, 'WITHSCORES')
local result = {now, head[2] or false, dead}
for _, m in ipairs(out) do result[#result + 1] = m end
return result
"""

SETTLE = _MESSAGE_PRELUDE + """
-- KEYS[1] in-flight zset, KEYS[2] dead-letter list, KEYS[3] destination list
-- ARGV[1] message element, ARGV[2] 'ack', 'dead' (its payload to the dead-letter list), 'release'
--         (undo this delivery: a receiver that was cancelled before it could see the message), or
--         a delay in ms (nack)
-- returns: 1 if the message was still in flight as this delivery (then settled), 0 if not (already
-- settled, or redelivered after its deadline).
if not redis.call('zscore', KEYS[1], ARGV[1]) then return 0 end
if ARGV[2] == 'ack' then
  redis.call('zrem', KEYS[1], ARGV[1])
elseif ARGV[2] == 'dead' then
  redis.call('rpush', KEYS[2], string.sub(ARGV[1], 33))
  redis.call('zrem', KEYS[1], ARGV[1])
elseif ARGV[2] == 'release' then
  local count, due = struct.unpack('>I4>d', ARGV[1], 21)
  local payload = string.sub(ARGV[1], 33)
  if count <= 1 then
    -- A first delivery goes back to the head of the destination, as if never received.
    redis.call('lpush', KEYS[3], payload)
  else
    local t = redis.call('TIME')
    local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    redis.call('zadd', KEYS[1], now, message(string.sub(ARGV[1], 5, 20), count - 1, due, payload))
  end
  redis.call('zrem', KEYS[1], ARGV[1])
else
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  redis.call('zadd', KEYS[1], 'XX', now + tonumber(ARGV[2]), ARGV[1])
end
return 1
"""
