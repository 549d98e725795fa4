"""The Lua functions every script starts with (``PRELUDE``): element parsing, the server clock, chunked
commands, hand-off lists and call ids.

Element kinds (the layouts, seen from Python, are in ``aiodelayq/_elements.py``):

- **strict** (Redisson >= 3.21.1, and ``strict=True``): ``struct.pack('Bc0Lc0', 8, <8 random bytes>,
  #payload, payload)``, in the timeout zset and in Redisson's insertion-order list;
- **legacy** (Redisson < 3.21.1, and ``wire_format="redisson-legacy"``): ``struct.pack('dLc0',
  <random double>, #payload, payload)``, zset and list;
- **fast** (aiodelayq's default): ``struct.pack('Bc0Lc0', 20, <id>, #payload, payload)`` with id =
  ``'adq' 0x01 | 8-byte big-endian insertion stamp (µs) | 8 random bytes``, zset only. Redisson's own
  ``unpack('Bc0Lc0')`` reads it like any other element.

``parse`` accepts every kind and checks every length, so a legacy element is never read as a strict
one (or the reverse) and garbage is recognised as garbage. An element that satisfies both the strict
and the legacy layout needs a legacy double whose first byte is 0x08 *and* a one-byte payload
``"\\0"``; it is read as strict. ``parse`` returns the payload (or nil) and whether the element is a
fast one (kept out of the insertion-order list, so nothing has to be removed from that list when it
moves).
"""

from __future__ import annotations

__all__ = ["PRELUDE"]

PRELUDE = """
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
-- The server clock in epoch ms, and the raw TIME reply.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000), t
end
-- redis.call(cmd, key, [flag,] values...) in chunks of 1000 values (Lua's unpack has a stack
-- limit); 1000 is even, so ZADD's score/member pairs stay together.
local function chunked(cmd, key, flag, values)
  for i = 1, #values, 1000 do
    local last = math.min(i + 999, #values)
    if flag then
      redis.call(cmd, key, flag, unpack(values, i, last))
    else
      redis.call(cmd, key, unpack(values, i, last))
    end
  end
end
-- 'lpush' of a reversed list puts the values at the head in their original order.
local function reversed(values)
  local out = {}
  for i = #values, 1, -1 do out[#out + 1] = values[i] end
  return out
end
-- A list of strings as one string: each '>I4' length-prefixed (hand-off entries, call replies).
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
