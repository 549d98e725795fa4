"""Lua of the transfer scheduler: TRANSFER moves due elements to the destination list."""

from __future__ import annotations

from .._connections import Script
from .prelude import PRELUDE

__all__ = ["TRANSFER"]

TRANSFER = Script("transfer", PRELUDE + """
-- KEYS[1] destination list, KEYS[2] timeout zset, KEYS[3] delay list, KEYS[4] dead-letter list,
-- KEYS[5] hand-off hash, KEYS[6] hand-off leases zset
-- ARGV[1] at most this many elements are moved
-- returns: {moved, dead_lettered, next due score (epoch ms, text) or false, TIME seconds,
--           TIME micros, recovered, earliest hand-off lease deadline (ms, text) or false,
--           length of the destination list (consumers need not look when it is 0)}
-- Moves due elements (score <= now, server clock) in due order: the payload goes to the
-- destination; an element that is not a valid packed element goes, as it was, to the dead-letter
-- list, so one bad element can never stall the queue. Only elements that are in the insertion-
-- order list (strict, legacy, malformed ones) are LREMed from it: O(list) each. Fast elements cost
-- O(log N).
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
chunked('rpush', KEYS[1], nil, out)
chunked('rpush', KEYS[4], nil, bad)
for _, v in ipairs(listed) do redis.call('lrem', KEYS[3], 1, v) end
chunked('zrem', KEYS[2], nil, due)
local recovered = 0
for _, id in ipairs(redis.call('zrangebyscore', KEYS[6], '-inf', now, 'LIMIT', 0, 100)) do
  local blob = redis.call('hget', KEYS[5], id)
  if blob and blob ~= '' then
    local items = unpack_list(blob)
    chunked('lpush', KEYS[1], nil, reversed(items))
    recovered = recovered + #items
  end
  redis.call('hdel', KEYS[5], id)
  redis.call('zrem', KEYS[6], id)
end
local nxt = redis.call('zrange', KEYS[2], 0, 0, 'WITHSCORES')
local lease = redis.call('zrange', KEYS[6], 0, 0, 'WITHSCORES')
return {#out, #bad, nxt[2] or false, t[1], t[2], recovered, lease[2] or false, redis.call('llen', KEYS[1])}
""")
