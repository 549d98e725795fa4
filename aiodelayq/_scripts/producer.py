"""Lua of the producing side: OFFER, and NATIVE_LONG (the server's ``L`` layout, for fast elements
packed by the client)."""

from __future__ import annotations

from .._connections import Script
from .prelude import PRELUDE

__all__ = ["NATIVE_LONG", "OFFER"]

OFFER = Script("offer", PRELUDE + """
-- KEYS[1] destination list (names the cluster slot), KEYS[2] timeout zset, KEYS[3] delay list,
-- KEYS[4] channel, KEYS[5] calls zset, KEYS[6] call replies hash
-- ARGV[1] call id (16 bytes), ARGV[2] when the client issued the call, server ms as the client
-- estimates it ('' = no estimate), ARGV[3] element kind:
--   'fast':   elements packed by the client (with this server's 'L' size), all in one argument so
--             the client does not send thousands of arguments: ARGV[4] = concatenated
--             struct.pack('>dI4c0', delay ms, element), ARGV[5] = their count; zset only.
--   'strict' (8-byte id) or 'legacy' (dLc0): ARGV[4..] triples of delay ms, id (strict: 8 random
--             bytes; legacy: a decimal long), payload; packed here; zset + list.
-- returns: {base, now}: each item is due at base + its delay. base is the issue time when it is
-- sane (not after now, at most MAX_ISSUE_AGE_MS before it), else now, the server time (ms) of
-- this run. A resend of the same call id within the window writes nothing and returns {base} of
-- the first run (no now: that reply says nothing about the clock).
-- Publishes the earliest new due time when it is earlier than the previous zset head, so every
-- scheduler re-arms (Redisson publishes when the new element becomes the head).
local MAX_ISSUE_AGE_MS = 1000
local first = first_run(KEYS[5], ARGV[1])
if first then return {first} end
local now = now_ms()
local base = now
local issued = tonumber(ARGV[2])
if issued and issued <= now and issued >= now - MAX_ISSUE_AGE_MS then base = math.floor(issued) end
local head = redis.call('zrange', KEYS[2], 0, 0, 'WITHSCORES')
local old = head[2] and tonumber(head[2]) or nil
local kind = ARGV[3]
local earliest = nil
if kind == 'fast' then
  local blob, pos = ARGV[4], 1
  local zargs = {}
  for _ = 1, tonumber(ARGV[5]) do
    local d, element
    d, element, pos = struct.unpack('>dI4c0', blob, pos)
    zargs[#zargs + 1] = base + d
    zargs[#zargs + 1] = element
    if earliest == nil or base + d < earliest then earliest = base + d end
  end
  chunked('zadd', KEYS[2], 'NX', zargs)
else
  for i = 4, #ARGV, 3 do
    local due = base + tonumber(ARGV[i])
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
-- Remembered by base (at most MAX_ISSUE_AGE_MS before now): a resend returns it.
remember(KEYS[5], KEYS[6], ARGV[1], base, nil)
return {base, now}
""")

NATIVE_LONG = Script("native_long", """
-- returns: struct.pack('L', 1): the size and byte order of the server's native unsigned long
return struct.pack('L', 1)
""")
