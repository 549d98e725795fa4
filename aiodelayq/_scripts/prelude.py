"""The Lua functions every script starts with (``PRELUDE``): element parsing, the server clock, chunked
commands, hand-off lists and call ids.

Element kinds (the layouts, seen from Python, are in ``aiodelayq/_wire/elements.py``):

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
``"\\0"``; it is read as strict. ``parse`` returns the payload (or nil), whether the element is a
fast one (kept out of the insertion-order list, so nothing has to be removed from that list when it
moves), and where its key tag would start (see the keys section below).
"""

from __future__ import annotations

import re

__all__ = ["PRELUDE", "with_prelude"]

# The prelude in pieces: (name, the names it defines, the Lua). A script gets only the pieces it
# uses (with_prelude): every call runs the prelude's definitions again (closures, constants) and
# Redis steps Lua's garbage collector every 50 calls, so a GET that carried the whole prelude paid
# for seventeen functions it never called, and for their garbage.
_PIECES: list[tuple[str, tuple[str, ...], str]] = [
    ("parse", ("parse", "LSZ", "FAST_MAGIC"), """
local LSZ = string.len(struct.pack('L', 0))
local FAST_MAGIC = 'adq' .. string.char(1)
local function parse(v)
  local n = string.len(v)
  local b0 = string.byte(v, 1)
  if b0 == 8 and n >= 9 + LSZ then
    local len = struct.unpack('L', v, 10)
    if len == n - 9 - LSZ then return string.sub(v, 10 + LSZ), false, 2 end
  end
  if b0 == 20 and n >= 21 + LSZ and string.sub(v, 2, 5) == FAST_MAGIC then
    local len = struct.unpack('L', v, 22)
    if len == n - 21 - LSZ then return string.sub(v, 22 + LSZ), true, 14 end
  end
  if n >= 8 + LSZ then
    local len = struct.unpack('L', v, 9)
    if len == n - 8 - LSZ then return string.sub(v, 9 + LSZ), false, 1 end
  end
  return nil, false, nil
end
"""),
    ("dead", ("dead_entry", "DEAD_MAGIC", "DEAD_MAX_DELIVERIES", "DEAD_UNDECODABLE", "DEAD_MALFORMED",
              "DEAD_NACKED"), """
-- Dead-letter entries (layout in aiodelayq/_wire/elements.py): 'adq' 0x03 (the envelope, version 1) |
-- '>B' reason | '>I4' delivery count | '>d' server ms when it died | the raw bytes (the payload, or
-- the malformed element as found). Entries written before the envelope are raw bytes alone.
local DEAD_MAGIC = 'adq' .. string.char(3)
local DEAD_MAX_DELIVERIES, DEAD_UNDECODABLE, DEAD_MALFORMED, DEAD_NACKED = 1, 2, 3, 4
local function dead_entry(reason, count, now, raw)
  return DEAD_MAGIC .. struct.pack('>B>I4>d', reason, count, now) .. raw
end
"""),
    ("clock", ("now_ms",), """
-- The server clock in epoch ms, and the raw TIME reply.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000), t
end
"""),
    ("issue", ("issue_base", "MAX_ISSUE_AGE_MS"), """
-- The base of due times for a call the client issued at `issued` (server ms as it estimates them,
-- '' when it has no estimate): the issue time when it is sane (not after now, at most
-- MAX_ISSUE_AGE_MS before it), else now.
local MAX_ISSUE_AGE_MS = 1000
local function issue_base(issued, now)
  local t = tonumber(issued)
  if t and t <= now and t >= now - MAX_ISSUE_AGE_MS then return math.floor(t) end
  return now
end
"""),
    ("chunked", ("chunked",), """
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
"""),
    ("reversed", ("reversed",), """
-- 'lpush' of a reversed list puts the values at the head in their original order.
local function reversed(values)
  local out = {}
  for i = #values, 1, -1 do out[#out + 1] = values[i] end
  return out
end
"""),
    ("lists", ("pack_list", "unpack_list"), """
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
"""),
    ("calls", ("first_run", "remember", "CALL_WINDOW_MS"), """
-- Call ids: 16 random bytes the client picks per logical call and sends again with every resend.
-- A call that carries one is remembered for CALL_WINDOW_MS (zset 'calls' scored by its first run,
-- optional reply in the hash 'replies'), so a resend within the window is not applied twice.
-- Clients stop resending a call CALL_WINDOW_MS / 2 after they first sent it.
local CALL_WINDOW_MS = 60000
local function first_run(calls, id)
  local at = redis.call('zscore', calls, id)
  if not at then return nil end
  -- A resend of a call that ran: move its entry and back (never emptying the key, which a slot
  -- migration could then refuse to write again) so that this resend propagates a write, and a
  -- WAIT after it on its new connection also covers the first run (see _redis/durability.py).
  redis.call('zadd', calls, tonumber(at) + 1, id)
  redis.call('zadd', calls, at, id)
  return tonumber(at)
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
"""),
    ("index", ("element_tag", "index_pairs", "index_pair", "overflow_field", "index_find", "INDEX_V1",
               "INDEX_OVERFLOW"), """
-- Keys (aiodelayq/_producing/keyed.py). The key index hash maps a field to 0x01 (version) | pack_list({key,
-- element}): one pair per field, the key and its pending element. The field is the key's tag (the
-- first 8 bytes of its SHA-1, top bit set, computed by the client), carried in the element's id,
-- so a transfer finds the entry of what it moves without knowing the key: fast: the last 8 bytes
-- of the id (after the marker and the stamp); strict: the 8-byte id; legacy: the 8 bytes of the
-- double. Unkeyed fast elements have random bytes there with the top bit clear: a transfer can
-- drop the field of a moved fast element with the bit set without reading it (TRANSFER's cost).
-- A key whose tag is taken by another key with a pending element (a SHA-1 prefix collision) goes
-- to its overflow field ('#' .. SHA-1 hex of the key) with its fast element's tag bit cleared
-- (so no transfer ever drops the other key's field), and the field INDEX_OVERFLOW is set once:
-- from then on lookups that miss the tag also read the overflow field.
local INDEX_V1, INDEX_OVERFLOW = string.char(1), 'overflow'
local function element_tag(v)
  local n, b0 = string.len(v), string.byte(v, 1)
  if b0 == 8 and n >= 9 + LSZ and struct.unpack('L', v, 10) == n - 9 - LSZ then return string.sub(v, 2, 9) end
  if b0 == 20 and string.sub(v, 2, 5) == FAST_MAGIC then return string.sub(v, 14, 21) end
  return string.sub(v, 1, 8)
end
local function index_pairs(blob)
  if not blob or string.sub(blob, 1, 1) ~= INDEX_V1 then return {} end
  return unpack_list(string.sub(blob, 2))
end
local function index_pair(key, v)
  return INDEX_V1 .. struct.pack('>I4', string.len(key)) .. key .. struct.pack('>I4', string.len(v)) .. v
end
local function overflow_field(key)
  return '#' .. redis.sha1hex(key)
end
-- The pending element of `key`, its score (nil: not pending, a stale entry) and its field; nil
-- when the index has no entry for the key.
local function index_find(idx, zset, tag, key)
  local field, kv = tag, index_pairs(redis.call('hget', idx, tag))
  if kv[1] ~= key and redis.call('hget', idx, INDEX_OVERFLOW) then
    field = overflow_field(key)
    kv = index_pairs(redis.call('hget', idx, field))
  end
  if kv[1] ~= key then return nil, nil, nil end
  return kv[2], redis.call('zscore', zset, kv[2]), field
end
"""),
    ("unindex", ("unindex",), """
-- Drop the index entries of keyed elements that are no longer pending (transferred or removed).
-- `owned`: the tags of moved fast elements with the tag bit set: such an element owns its field
-- (see the index section), dropped unread; the caller collects them in the loop where it parses
-- the elements, so a transfer walks its elements once. `checked`: strict and legacy
-- elements, with in `starts` where their tag starts (parse's third value): their ids are
-- Redisson's random bytes as often as tags, so their field is dropped only if it holds this very
-- element. Appends to `owned`.
local function unindex(idx, owned, checked, starts)
  if #checked > 0 and redis.call('hlen', idx) > 0 then
    for i = 1, #checked, 1000 do
      local tags = {}
      for j = i, math.min(i + 999, #checked) do
        local s = starts[j]
        tags[#tags + 1] = string.sub(checked[j], s, s + 7)
      end
      local blobs = redis.call('hmget', idx, unpack(tags))
      for j, blob in ipairs(blobs) do
        if blob and index_pairs(blob)[2] == checked[i + j - 1] then owned[#owned + 1] = tags[j] end
      end
    end
  end
  chunked('hdel', idx, nil, owned)
end
"""),
    ("sweep", ("sweep_index",), """
-- Stale index pairs (their element was moved by Redisson's transfer, or removed by payload) are
-- harmless; a few random entries are checked per keyed call so they do not pile up.
local function sweep_index(idx, zset, probes)
  for _, field in ipairs(redis.call('hrandfield', idx, probes)) do
    local kv = index_pairs(redis.call('hget', idx, field))
    if kv[2] and not redis.call('zscore', zset, kv[2]) then redis.call('hdel', idx, field) end
  end
end
"""),
]

PRELUDE = "\n" + "".join(text for _, _, text in _PIECES)
"""Every piece, in order (for tests and tools; scripts use :func:`with_prelude`)."""


def with_prelude(body: str) -> str:
    """``body`` preceded by the prelude pieces it uses, directly or through other pieces, in order."""
    needed: set[str] = set()
    text = body
    changed = True
    while changed:  # a piece may use another piece (keys -> parse, chunked, lists)
        changed = False
        for name, names, lua in _PIECES:
            if name not in needed and any(re.search(rf"\b{n}\b", text) for n in names):
                needed.add(name)
                text += lua
                changed = True
    return "\n" + "".join(lua for name, _, lua in _PIECES if name in needed) + body
