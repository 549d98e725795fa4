"""Lua of the pending side: the paged walks over the timeout zset (CONTAINS_PAGE, READ_PAGE,
REMOVE_PAGE). How the walk's cursor survives concurrent changes: ``aiodelayq/_producing/pending.py``."""

from __future__ import annotations

from .._redis.connections import Script
from .prelude import with_prelude

__all__ = ["CONTAINS_PAGE", "COUNTS", "PAGE_SIZE", "PEEK", "READ_PAGE", "REMOVE_PAGE"]

# Elements one page script reads at most. Measured with a million pending fast elements (12-byte
# payloads) on a shared 2-core machine (tests/test_pending_scale.py): a page of 1000 takes 0.6-0.9 ms
# of server time on average for contains/remove and 1.0-1.9 ms for read_all (which returns every
# payload), at most ~2.7 ms; a walk of the million takes ~0.8 s (contains, remove) and ~3 s
# (read_all, mostly client-side decoding). Pages of 2000 saved little (contains 0.65 s instead of
# 0.75 s) and doubled the page cost. A page also stops after about 256 KiB of elements
# (PAGE_BYTES below), so large payloads cannot make it long either; the one exception is a single
# element of a megabyte or more: a page reads at least one, and copying it costs a few ms per MB in
# any script that reads it (TRANSFER too).
PAGE_SIZE = 1000

# The walk shared by the page scripts (after the prelude, which brings ``parse``, ``now_ms``,
# ``first_run``/``remember`` and ``pack_list``/``unpack_list``).
_WALK = """
local PAGE_BYTES = 262144
local CHUNK = 128
-- a < b in byte order, as the zset orders members of equal score (memcmp). Lua's own '<' uses the
-- server's locale collation (strcoll), which need not be byte order.
local function bytes_lt(a, b)
  local na, nb = string.len(a), string.len(b)
  for i = 1, math.min(na, nb) do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then return x < y end
  end
  return na < nb
end
-- The rank of the first element after the cursor (score as text, member); 0 without a cursor
-- (score ''). If the cursor element is still there, the rank after it; else (it fell due or was
-- removed) a binary search for the first member after it among the elements of its score.
local function start_rank(zset, score, member)
  if score == '' then return 0 end
  local s = redis.call('zscore', zset, member)
  if s and tonumber(s) == tonumber(score) then return redis.call('zrank', zset, member) + 1 end
  local lo = redis.call('zcount', zset, '-inf', '(' .. score)
  local hi = redis.call('zcount', zset, '-inf', score)
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    if bytes_lt(member, redis.call('zrange', zset, mid, mid)[1]) then hi = mid else lo = mid + 1 end
  end
  return lo
end
-- One page of the walk: calls fn(element) for the elements after the cursor, in zset order, at
-- most `limit` of them and about PAGE_BYTES bytes (at least one); fn returning true ends the page
-- there. fn must not change the zset (ranks would shift): collect, then write. Returns the cursor
-- of the last element given to fn (score text, member), or nil when the zset ended first.
-- Elements are fetched in batches sized by the average element so far (the first batch is one
-- element), so a page of large elements does not copy many more than it uses.
local function walk_page(zset, score, member, limit, fn)
  local rank = start_rank(zset, score, member)
  local seen, bytes, want = 0, 0, 1
  while true do
    local batch = redis.call('zrange', zset, rank, rank + want - 1)
    for _, v in ipairs(batch) do
      seen = seen + 1
      bytes = bytes + string.len(v)
      if fn(v) or seen >= limit or bytes >= PAGE_BYTES then return redis.call('zscore', zset, v), v end
    end
    if #batch < want then return nil end
    rank = rank + #batch
    want = math.max(1, math.min(CHUNK, limit - seen, math.floor((PAGE_BYTES - bytes) * seen / bytes)))
  end
end
-- A test for "v carries one of these payloads": returns the payload and is_fast, or nil. The
-- element's length is checked first (header sizes of the three formats), so most elements are
-- never unpacked.
local function matcher(payloads)
  local wanted, sizes = {}, {}
  for _, p in ipairs(payloads) do
    wanted[p] = true
    for _, h in ipairs({8 + LSZ, 9 + LSZ, 21 + LSZ}) do sizes[string.len(p) + h] = true end
  end
  return function(v)
    if not sizes[string.len(v)] then return nil end
    local payload, fast = parse(v)
    if payload and wanted[payload] then return payload, fast end
    return nil
  end
end
"""

CONTAINS_PAGE = Script("contains_page", with_prelude(_WALK + """
-- KEYS[1] timeout zset
-- ARGV[1] cursor score ('' = from the start), ARGV[2] cursor member, ARGV[3] page size,
-- ARGV[4] payload
-- returns: {1} if an element of this page carries the payload; else {0, cursor score, cursor
-- member} to go on from, or {0} when the walk is over. Read-only.
local match = matcher({ARGV[4]})
local found = false
local score, member = walk_page(KEYS[1], ARGV[1], ARGV[2], tonumber(ARGV[3]), function(v)
  found = match(v) ~= nil
  return found
end)
if found then return {1} end
if score then return {0, score, member} end
return {0}
"""))

READ_PAGE = Script("read_page", with_prelude(_WALK + """
-- KEYS[1] timeout zset
-- ARGV[1] cursor score ('' = from the start), ARGV[2] cursor member, ARGV[3] page size
-- returns: {cursor score, cursor member, payloads...}: the payloads of this page's elements in zset
-- order (malformed elements skipped); the cursor is false, false when the walk is over. Read-only.
local out = {false, false}
local score, member = walk_page(KEYS[1], ARGV[1], ARGV[2], tonumber(ARGV[3]), function(v)
  local payload = parse(v)
  if payload then out[#out + 1] = payload end
end)
if score then out[1], out[2] = score, member end
return out
"""))

REMOVE_PAGE = Script("remove_page", with_prelude(_WALK + """
-- KEYS[1] timeout zset, KEYS[2] delay list, KEYS[3] calls zset, KEYS[4] call replies hash
-- ARGV[1] call id (16 bytes, the same for a resend of this page), ARGV[2] cursor score ('' = from
-- the start), ARGV[3] cursor member, ARGV[4] page size, ARGV[5] '1': stop at the first match,
-- '0': every match; ARGV[6] '1' for a resend, '0' for the first attempt; ARGV[7..] payloads
-- returns: {removed, cursor score, cursor member}; the cursor is false, false when the walk is over
-- (with '1', a page that removed one ends the walk too).
-- Each match is ZREMed; a non-fast one (Redisson's, strict, legacy) is also LREMed from the delay
-- list: O(list), Redisson's cost. Removals come first, then the call is remembered: under
-- maxmemory only a script's first write is refused, and deletions are never refused.
-- The reply is remembered under the call id for the call window when the page removed something,
-- and always by a resend: a later run of the id (a resend, or the first attempt arriving late on a
-- dropped connection) answers as the remembered run did and removes nothing. A first attempt that
-- removed nothing only read and leaves no trace (a walk for an absent item writes nothing).
if first_run(KEYS[3], ARGV[1]) then
  local r = unpack_list(redis.call('hget', KEYS[4], ARGV[1]) or '')
  if #r == 3 then
    if r[2] == '' then return {tonumber(r[1]), false, false} end
    return {tonumber(r[1]), r[2], r[3]}
  end
end
local payloads = {}
for i = 7, #ARGV do payloads[#payloads + 1] = ARGV[i] end
local match = matcher(payloads)
local first_only = ARGV[5] == '1'
local hits, listed = {}, {}
local score, member = walk_page(KEYS[1], ARGV[2], ARGV[3], tonumber(ARGV[4]), function(v)
  local payload, fast = match(v)
  if payload == nil then return false end
  hits[#hits + 1] = v
  if not fast then listed[#listed + 1] = v end
  return first_only
end)
for _, v in ipairs(hits) do redis.call('zrem', KEYS[1], v) end
for _, v in ipairs(listed) do redis.call('lrem', KEYS[2], 1, v) end
if #hits > 0 or ARGV[6] == '1' then
  remember(KEYS[3], KEYS[4], ARGV[1], now_ms(), pack_list({tostring(#hits), score or '', member or ''}))
end
return {#hits, score or false, member or false}
"""))

PEEK = Script("peek", with_prelude("""
-- KEYS[1] timeout zset, KEYS[2] key index hash
-- ARGV[1] at most this many elements (the soonest due)
-- returns: {element, due ms (text), payload or false (malformed), key or false, ...} in due order:
-- four entries per element. The key is the one whose index entry holds this very element (an item
-- whose key collided into an overflow field reads as unkeyed). Read-only.
local out = {}
local indexed = redis.call('hlen', KEYS[2]) > 0
local head = redis.call('zrange', KEYS[1], 0, tonumber(ARGV[1]) - 1, 'WITHSCORES')
for i = 1, #head, 2 do
  local v = head[i]
  local payload = parse(v)
  local key = false
  if payload and indexed then
    local kv = index_pairs(redis.call('hget', KEYS[2], element_tag(v)))
    if kv[2] == v then key = kv[1] end
  end
  out[#out + 1] = v
  out[#out + 1] = head[i + 1]
  out[#out + 1] = payload or false
  out[#out + 1] = key
end
return out
"""))

COUNTS = Script("counts", """
-- KEYS[1] timeout zset, KEYS[2] destination list, KEYS[3] in-flight zset, KEYS[4] dead-letter list
-- returns: {pending, ready, in flight, dead letters, earliest due ms (text) or false}: O(1) each
-- but the last (O(log N)), in one atomic read. Read-only.
local head = redis.call('zrange', KEYS[1], 0, 0, 'WITHSCORES')
return {redis.call('zcard', KEYS[1]), redis.call('llen', KEYS[2]), redis.call('zcard', KEYS[3]),
        redis.call('llen', KEYS[4]), head[2] or false}
""")
