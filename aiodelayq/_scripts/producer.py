"""Lua of the producing side: OFFER, and NATIVE_LONG (the server's ``L`` layout, for fast elements
packed by the client)."""

from __future__ import annotations

from .._connections import Script
from .prelude import PRELUDE

__all__ = ["NATIVE_LONG", "OFFER"]

OFFER = Script("offer", PRELUDE + """
-- KEYS[1] destination list (names the cluster slot), KEYS[2] timeout zset, KEYS[3] delay list,
-- KEYS[4] channel, KEYS[5] calls zset, KEYS[6] call replies hash, KEYS[7] key index hash
-- ARGV[1] call id (16 bytes), ARGV[2] when the client issued the call, server ms as the client
-- estimates it ('' = no estimate), ARGV[3] element kind, ARGV[4] keys: '' for a call without
-- keys, else pack_list of one entry per item: '' (no key), or 'n' | key (keep a pending item of
-- that key) or 'r' | key (replace it); the element of a keyed item carries its key's tag.
-- ARGV[5..] by kind:
--   'fast':   elements packed by the client (with this server's 'L' size), all in one argument so
--             the client does not send thousands of arguments: ARGV[5] = concatenated
--             struct.pack('>dI4c0', delay ms, element), ARGV[6] = their count; zset only.
--   'strict' (8-byte id) or 'legacy' (dLc0): ARGV[5..] triples of delay ms, id (strict: 8 bytes;
--             legacy: a decimal long, or for a keyed item the 8 bytes of the double), payload;
--             packed here; zset + list.
-- returns: {base, now, outcome}: each item is due at base + its delay. base is the issue time when
-- it is sane (not after now, at most MAX_ISSUE_AGE_MS before it), else now, the server time (ms)
-- of this run. outcome is '' for a call without keys, else one letter per item, 'a' added, 'r'
-- replaced a pending item of its key, 'p' kept the pending item of its key (nothing written),
-- then for every 'p' ',' and that item's due ms. A resend of the same call id within the window
-- writes nothing and returns {base, false, outcome} of the first run.
-- Publishes the earliest new due time when it is earlier than the previous zset head, so every
-- scheduler re-arms (Redisson publishes when the new element becomes the head).
local first = first_run(KEYS[5], ARGV[1])
if first then return {first, false, redis.call('hget', KEYS[6], ARGV[1]) or ''} end
local now = now_ms()
local base = issue_base(ARGV[2], now)
local head = redis.call('zrange', KEYS[2], 0, 0, 'WITHSCORES')
local old = head[2] and tonumber(head[2]) or nil
local kind = ARGV[3]
local keys = ARGV[4] ~= '' and unpack_list(ARGV[4]) or nil
local earliest = nil
local letters, kept = {}, {}
-- A keyed item, one at a time (a key may come twice in one call). Returns whether it is written.
local function keyed(entry, due, value)
  local key = string.sub(entry, 2)
  local tag = element_tag(value)
  local kv, at, score = index_find(KEYS[7], KEYS[2], tag, key)
  if score and string.sub(entry, 1, 1) ~= 'r' then
    letters[#letters + 1] = 'p'
    kept[#kept + 1] = ',' .. score
    return false
  end
  if score then
    local gone = kv[at + 1]
    redis.call('zrem', KEYS[2], gone)
    local _, fast = parse(gone)
    if not fast then redis.call('lrem', KEYS[3], 1, gone) end
    letters[#letters + 1] = 'r'
  else
    letters[#letters + 1] = 'a'
  end
  if at then kv[at + 1] = value else kv[#kv + 1] = key; kv[#kv + 1] = value end
  index_put(KEYS[7], tag, kv)
  return true
end
if kind == 'fast' then
  local blob, pos = ARGV[5], 1
  local zargs = {}
  for i = 1, tonumber(ARGV[6]) do
    local d, element
    d, element, pos = struct.unpack('>dI4c0', blob, pos)
    local due = base + d
    local entry = keys and keys[i] or ''
    if entry == '' then
      if keys then letters[#letters + 1] = 'a' end
      zargs[#zargs + 1] = due
      zargs[#zargs + 1] = element
      if earliest == nil or due < earliest then earliest = due end
    elseif keyed(entry, due, element) then
      redis.call('zadd', KEYS[2], due, element)
      if earliest == nil or due < earliest then earliest = due end
    end
  end
  chunked('zadd', KEYS[2], 'NX', zargs)
else
  for i = 5, #ARGV, 3 do
    local due = base + tonumber(ARGV[i])
    local entry = keys and keys[(i - 2) / 3] or ''
    local id, payload = ARGV[i + 1], ARGV[i + 2]
    local value
    if kind == 'legacy' and entry ~= '' then
      value = id .. struct.pack('Lc0', string.len(payload), payload)
    elseif kind == 'legacy' then
      value = struct.pack('dLc0', tonumber(id), string.len(payload), payload)
    else
      value = struct.pack('Bc0Lc0', string.len(id), id, string.len(payload), payload)
    end
    local write
    if entry == '' then
      if keys then letters[#letters + 1] = 'a' end
      write = redis.call('zadd', KEYS[2], 'NX', due, value) == 1
    else
      write = keyed(entry, due, value)
      if write then redis.call('zadd', KEYS[2], due, value) end
    end
    if write then
      redis.call('rpush', KEYS[3], value)
      if earliest == nil or due < earliest then earliest = due end
    end
  end
end
if earliest ~= nil and (old == nil or earliest < old) then
  redis.call('publish', KEYS[4], string.format('%d', earliest))
end
local outcome = table.concat(letters) .. table.concat(kept)
if keys then sweep_index(KEYS[7], KEYS[2], 2) end
-- Remembered by base (at most MAX_ISSUE_AGE_MS before now): a resend returns it.
remember(KEYS[5], KEYS[6], ARGV[1], base, outcome ~= '' and outcome or nil)
return {base, now, outcome}
""")

NATIVE_LONG = Script("native_long", """
-- returns: struct.pack('L', 1): the size and byte order of the server's native unsigned long
return struct.pack('L', 1)
""")
