"""Lua of keyed pending items: CANCEL, RESCHEDULE and GET by key (the key index: see the prelude)."""

from __future__ import annotations

from .._redis.connections import Script
from .prelude import with_prelude

__all__ = ["CANCEL", "GET", "RESCHEDULE"]

CANCEL = Script("cancel", with_prelude("""
-- KEYS[1] timeout zset, KEYS[2] delay list, KEYS[3] key index hash, KEYS[4] channel, KEYS[5] calls
-- zset, KEYS[6] call replies hash
-- ARGV[1] call id, ARGV[2] key, ARGV[3] its tag
-- returns: 1 if the pending item of the key was removed, 0 if none was pending (a stale index
-- entry is dropped). A resend of the call id returns the first run's answer.
if first_run(KEYS[5], ARGV[1]) then return tonumber(redis.call('hget', KEYS[6], ARGV[1])) end
local v, score, field = index_find(KEYS[3], KEYS[1], ARGV[3], ARGV[2])
local removed = 0
if score then
  redis.call('zrem', KEYS[1], v)
  local _, fast = parse(v)
  if not fast then redis.call('lrem', KEYS[2], 1, v) end
  removed = 1
end
if field then redis.call('hdel', KEYS[3], field) end
remember(KEYS[5], KEYS[6], ARGV[1], now_ms(), tostring(removed))
return removed
"""))

RESCHEDULE = Script("reschedule", with_prelude("""
-- KEYS as CANCEL
-- ARGV[1] call id, ARGV[2] key, ARGV[3] its tag, ARGV[4] issue time (server ms as the client
-- estimates it, '' = none), ARGV[5] delay ms
-- returns: the new due time (ms) of the pending item of the key, due at the issue time (when sane,
-- as OFFER) + delay; false if none was pending. Publishes the due time when it becomes the
-- earliest pending one. A resend of the call id returns the first run's answer.
if first_run(KEYS[5], ARGV[1]) then
  local r = redis.call('hget', KEYS[6], ARGV[1])
  if r == '' then return false end
  return tonumber(r)
end
local now = now_ms()
local v, score, field = index_find(KEYS[3], KEYS[1], ARGV[3], ARGV[2])
local due = false
if score then
  due = issue_base(ARGV[4], now) + tonumber(ARGV[5])
  local head = redis.call('zrange', KEYS[1], 0, 0, 'WITHSCORES')
  redis.call('zadd', KEYS[1], 'XX', due, v)
  if head[2] == nil or due < tonumber(head[2]) then
    redis.call('publish', KEYS[4], string.format('%d', due))
  end
elseif field then
  redis.call('hdel', KEYS[3], field)
end
remember(KEYS[5], KEYS[6], ARGV[1], now, due and string.format('%d', due) or '')
return due
"""))

GET = Script("get", with_prelude("""
-- KEYS[1] timeout zset, KEYS[2] key index hash
-- ARGV[1] key, ARGV[2] its tag
-- returns: {payload, due ms (text)} of the pending item of the key, or false (none, or a
-- malformed element). Read-only.
local v, score = index_find(KEYS[2], KEYS[1], ARGV[2], ARGV[1])
if not score then return false end
local payload = parse(v)
if not payload then return false end
return {payload, score}
"""))
