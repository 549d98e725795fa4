-- defines: tier_bucket tier_entry tier_forget promote tier_next
-- uses: lib/chunked.lua
-- The tier (docs/design.md, "Tiered pending"): unkeyed fast elements due far ahead wait in lists,
-- one per bucket of due times [start, start + width), start a multiple of the width (at most
-- 60,000 ms). A bucket is the list 'aiodelayq_tier_<start>' .. the suffix of the tier index's name
-- (':{N}': the hash tag, so the queue's cluster slot); each entry is struct.pack('>I2', due -
-- start) .. element, in the order offered (aiodelayq/_wire/elements.py: tier entries). The index
-- zset maps each bucket's start (member, decimal ms) to its promotion time (score: start - width);
-- the count key holds how many entries the buckets hold. Every script that changes a bucket keeps
-- the index (a bucket is listed while it exists) and the count with it.
local function tier_bucket(K, start)
  return 'aiodelayq_tier_' .. start .. string.sub(K.tier_index, 21)  -- 21: after 'aiodelayq_tier_index'
end
-- The due time and the element of an entry of the bucket starting at `start` (a number). An
-- entry shorter than its offset (never written by aiodelayq) is due at the start, the entry itself
-- its element: promoted as it is, it is dead-lettered when due, like any malformed element.
local function tier_entry(e, start)
  if string.len(e) < 2 then return start, e end
  return start + struct.unpack('>I2', e), string.sub(e, 3)
end
-- `n` entries left the buckets: the count goes down (and away at 0, so an idle queue keeps no key).
local function tier_forget(K, n)
  if n > 0 and redis.call('incrby', K.tier_count, -n) <= 0 then redis.call('unlink', K.tier_count) end
end
-- Promote the buckets whose promotion time has come (score <= now), in index order, into the
-- timeout zset at their due times: at most `budget` entries, each bucket's popped from its tail
-- (RPOP: positions counted from the head, which the pending walks use, stay put); with `late`, only
-- the buckets whose start has come too (their entries may be due). An emptied bucket leaves the
-- index; a key that is not a list (nobody's bucket) leaves it too, untouched.
-- Returns how many entries moved, and the start (a number) of the earliest bucket whose start has
-- come that still holds entries (nil: none): nothing due at or after that start may be moved to
-- the destination before its entries are in the zset.
local function promote(K, now, budget, late)
  local ready = redis.call('zrangebyscore', K.tier_index, '-inf', now, 'LIMIT', 0, 64)
  local moved, left = 0, nil
  for _, start in ipairs(ready) do
    local s, want = tonumber(start), budget - moved
    local kept = want <= 0 or (late and s > now)
    if not kept then
      local key = tier_bucket(K, start)
      local got = redis.pcall('rpop', key, want)
      if type(got) == 'table' and got.err then
        redis.call('zrem', K.tier_index, start)
      else
        got = got or {}
        local z = {}
        for i, e in ipairs(got) do
          z[2 * i - 1], z[2 * i] = tier_entry(e, s)
        end
        chunked('zadd', K.timeout_set, nil, z)
        moved = moved + #got
        if #got < want or redis.call('llen', key) == 0 then
          redis.call('zrem', K.tier_index, start)
        else
          kept = true
        end
      end
    end
    if kept and s <= now and (left == nil or s < left) then left = s end
  end
  if #ready == 64 then  -- more may be ready than read: the next one bounds the move too
    local more = tonumber(redis.call('zrangebyscore', K.tier_index, '-inf', now, 'LIMIT', 0, 1)[1])
    if more and more <= now and (left == nil or more < left) then left = more end
  end
  tier_forget(K, moved)
  return moved, left
end
-- The queue's next wake-up: the earlier of the zset's head score and the first bucket's promotion
-- time (text), or false when neither exists.
local function tier_next(K)
  local head = redis.call('zrange', K.timeout_set, 0, 0, 'WITHSCORES')
  local first = redis.call('zrange', K.tier_index, 0, 0, 'WITHSCORES')
  if first[2] and (not head[2] or tonumber(first[2]) < tonumber(head[2])) then return first[2] end
  return head[2] or false
end
