-- defines: first_run remember CALL_WINDOW_MS
-- Call ids: 16 random bytes the client picks per logical call and sends again with every resend.
-- A call that carries one is remembered for CALL_WINDOW_MS (K.calls scored by its first run,
-- optional reply in K.call_replies), so a resend within the window is not applied twice.
-- Clients stop resending a call CALL_WINDOW_MS / 2 after they first sent it.
local CALL_WINDOW_MS = 60000
local function first_run(K, id)
  local at = redis.call('zscore', K.calls, id)
  if not at then return nil end
  -- A resend of a call that ran: move its entry and back (never emptying the key, which a slot
  -- migration could then refuse to write again) so that this resend propagates a write, and a
  -- WAIT after it on its new connection also covers the first run (see _redis/durability.py).
  redis.call('zadd', K.calls, tonumber(at) + 1, id)
  redis.call('zadd', K.calls, at, id)
  return tonumber(at)
end
local function remember(K, id, now, reply)
  redis.call('zadd', K.calls, now, id)
  if reply ~= nil then redis.call('hset', K.call_replies, id, reply) end
  -- Prune a bounded number of expired ids per call: the set stays as large as one window.
  local old = redis.call('zrangebyscore', K.calls, '-inf', now - CALL_WINDOW_MS, 'LIMIT', 0, 100)
  if #old > 0 then
    redis.call('zrem', K.calls, unpack(old))
    redis.call('hdel', K.call_replies, unpack(old))
  end
end
