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

# Shared prelude. ``payload_of`` accepts both wire formats and checks every length, so a legacy
# element is never read as a current one (or the reverse) and garbage is recognised as garbage:
#   current (Redisson >= 3.21.1): struct.pack('Bc0Lc0', 8, <8 random bytes>, #payload, payload)
#   legacy  (Redisson <  3.21.1): struct.pack('dLc0', <random double>, #payload, payload)
# An element that satisfies both layouts needs a legacy double whose first byte is 0x08 *and* a
# one-byte payload "\0"; it is read as the current format.
_PRELUDE = """
local LSZ = string.len(struct.pack('L', 0))
local function payload_of(v)
  local n = string.len(v)
  if n >= 9 + LSZ and string.byte(v, 1) == 8 then
    local len = struct.unpack('L', v, 10)
    if len == n - 9 - LSZ then return string.sub(v, 10 + LSZ) end
  end
  if n >= 8 + LSZ then
    local len = struct.unpack('L', v, 9)
    if len == n - 8 - LSZ then return string.sub(v, 9 + LSZ) end
  end
  return nil
end
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000), t
end
"""

OFFER = _PRELUDE + """
-- KEYS[1] destination list (names the cluster slot), KEYS[2] timeout zset, KEYS[3] delay list,
-- KEYS[4] channel
-- ARGV[1] '1' = current format (Bc0Lc0), '0' = legacy (dLc0)
-- ARGV[2..] triples: delay in ms (integer >= 0), random id (8 bytes, or a decimal long for legacy),
--           payload
-- returns: the due time of each item in epoch ms (server clock), in argument order.
-- Publishes the earliest new due time when it is earlier than the previous zset head, so every
-- scheduler re-arms (Redisson publishes when the new element becomes the head).
local now = now_ms()
local head = redis.call('zrange', KEYS[2], 0, 0, 'WITHSCORES')
local old = head[2] and tonumber(head[2]) or nil
local current = ARGV[1] == '1'
local dues = {}
local earliest = nil
for i = 2, #ARGV, 3 do
  local due = now + tonumber(ARGV[i])
  local payload = ARGV[i + 2]
  local value
  if current then
    value = struct.pack('Bc0Lc0', string.len(ARGV[i + 1]), ARGV[i + 1], string.len(payload), payload)
  else
    value = struct.pack('dLc0', tonumber(ARGV[i + 1]), string.len(payload), payload)
  end
  -- A client library may resend this script when its reply was lost: the same random id then
  -- finds its element already there, and nothing is written twice.
  local existing = redis.call('zscore', KEYS[2], value)
  if existing then
    dues[#dues + 1] = tonumber(existing)
  else
    redis.call('zadd', KEYS[2], due, value)
    redis.call('rpush', KEYS[3], value)
    dues[#dues + 1] = due
    if earliest == nil or due < earliest then earliest = due end
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
-- list, so one bad element can never stall the queue.
local now, t = now_ms()
local due = redis.call('zrangebyscore', KEYS[2], '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
local moved, dead = 0, 0
for _, v in ipairs(due) do
  local payload = payload_of(v)
  if payload then
    redis.call('rpush', KEYS[1], payload)
    moved = moved + 1
  else
    redis.call('rpush', KEYS[4], v)
    dead = dead + 1
  end
  redis.call('lrem', KEYS[3], 1, v)
end
for i = 1, #due, 1000 do
  redis.call('zrem', KEYS[2], unpack(due, i, math.min(i + 999, #due)))
end
local nxt = redis.call('zrange', KEYS[2], 0, 0, 'WITHSCORES')
return {moved, dead, nxt[2] or false, t[1], t[2]}
"""

READ_ALL = _PRELUDE + """
-- KEYS[1] delay list
-- returns: the payloads of the pending elements in insertion order (malformed ones skipped)
local result = {}
local n = redis.call('llen', KEYS[1])
for start = 0, n - 1, 1000 do
  for _, v in ipairs(redis.call('lrange', KEYS[1], start, start + 999)) do
    local payload = payload_of(v)
    if payload then result[#result + 1] = payload end
  end
end
return result
"""

CONTAINS = _PRELUDE + """
-- KEYS[1] delay list
-- ARGV[1] payload
-- returns: 1 if a pending element carries this payload, else 0
local n = redis.call('llen', KEYS[1])
for start = 0, n - 1, 1000 do
  for _, v in ipairs(redis.call('lrange', KEYS[1], start, start + 999)) do
    if payload_of(v) == ARGV[1] then return 1 end
  end
end
return 0
"""

REMOVE = _PRELUDE + """
-- KEYS[1] delay list, KEYS[2] timeout zset
-- ARGV[1] '1' = remove only the first match (insertion order), '0' = every match
-- ARGV[2..] payloads
-- returns: how many pending elements were removed (from both the list and the zset)
local wanted = {}
for i = 2, #ARGV do wanted[ARGV[i]] = true end
local first_only = ARGV[1] == '1'
local matches = {}
local n = redis.call('llen', KEYS[1])
for start = 0, n - 1, 1000 do
  for _, v in ipairs(redis.call('lrange', KEYS[1], start, start + 999)) do
    local payload = payload_of(v)
    if payload and wanted[payload] then
      matches[#matches + 1] = v
      if first_only then break end
    end
  end
  if first_only and #matches > 0 then break end
end
for _, v in ipairs(matches) do
  redis.call('zrem', KEYS[2], v)
  redis.call('lrem', KEYS[1], 1, v)
end
return #matches
"""


@dataclass(frozen=True)
class Scripts:
    """The scripts registered on one client (``EVALSHA`` with a ``SCRIPT LOAD`` fallback)."""

    offer: Any
    transfer: Any
    read_all: Any
    contains: Any
    remove: Any


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
        )
        _registered[client] = scripts
    return scripts
