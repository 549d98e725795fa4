-- defines: schedule_record read_schedule add_occurrence recur_next recur_advance REFILL_BELOW RESYNC_MS
-- uses: lib/index.lua lib/item.lua lib/parse.lua
-- Recurring items (aiodelayq/_recurring/schedules.py). The schedules hash maps a schedule's key to
-- its record: '>I4' number of its current occurrence | '>B' 1 when its cron times ran out before
-- the next occurrence could be scheduled (stalled), else 0 | '>d' every ms (0: a cron schedule) |
-- '>d' anchor ms (every: occurrences are due at anchor + k * every) | '>I2' length of its key index
-- field | the field | the 8-byte tag of its elements | '>I2' length of its cron spec | the spec
-- (expression, newline, time zone) | the upcoming due times of a cron schedule, '>d' each,
-- ascending (the client lists them: a consumer lists more when fewer than REFILL_BELOW are left).
-- An occurrence is a keyed fast element whose payload is an item envelope naming the key and its
-- occurrence number; at any time exactly one occurrence is pending, ready or handed out. A stalled
-- schedule keeps a resync pending instead (the envelope's flag 2), due RESYNC_MS later and again
-- after each hand-out: whichever consumer gets it lists more times, which restarts the schedule;
-- nobody is handed an item meanwhile.
local REFILL_BELOW, RESYNC_MS = 32, 60000
local function schedule_record(seq, stalled, every, anchor, field, tag, spec, times)
  return struct.pack('>I4B>d>d>I2', seq, stalled, every, anchor, string.len(field)) .. field .. tag ..
    struct.pack('>I2', string.len(spec)) .. spec .. times
end
-- The fields of a record: seq, stalled, every, anchor, field, tag, spec, times.
local function read_schedule(rec)
  local seq, stalled, every, anchor, flen = struct.unpack('>I4B>d>d>I2', rec)
  local tpos = 24 + flen
  local slen = struct.unpack('>I2', rec, tpos + 8)
  return seq, stalled, every, anchor, string.sub(rec, 24, 23 + flen), string.sub(rec, tpos, tpos + 7),
    string.sub(rec, tpos + 10, tpos + 9 + slen), string.sub(rec, tpos + 10 + slen)
end
-- Make `payload` (an occurrence envelope) the pending item of `key`, due at `due`, replacing the
-- key's pending element if any; publishes when it becomes the head of the zset.
local function add_occurrence(K, key, field, tag, payload, due, now)
  local old = index_pairs(redis.call('hget', K.key_index, field))
  if old[1] == key and old[2] and redis.call('zrem', K.timeout_set, old[2]) == 1 then
    local _, fast = parse(old[2])
    if not fast then redis.call('lrem', K.delay_list, 1, old[2]) end
  end
  local us = now * 1000
  local stamp = struct.pack('>I4>I4', math.floor(us / 4294967296), us % 4294967296)
  local v = struct.pack('Bc0Lc0', 20, FAST_MAGIC .. stamp .. tag, string.len(payload), payload)
  local head = redis.call('zrange', K.timeout_set, 0, 0, 'WITHSCORES')
  redis.call('zadd', K.timeout_set, due, v)
  redis.call('hset', K.key_index, field, index_pair(key, v))
  if not head[2] or due < tonumber(head[2]) then redis.call('publish', K.channel, string.format('%d', due)) end
end
-- Schedule the occurrence after occurrence `seq` (`payload`) of the record `rec` of `key`: the
-- schedule's first due time after now (occurrences missed meanwhile collapse into the one being
-- handed out). Returns whether the consumer should list more cron times (few left, or none: then
-- the record is marked stalled and keeps its number, with a resync pending, until a REFILL
-- schedules the next).
local function recur_advance(K, key, rec, payload, now)
  local seq, _, every, anchor, field, tag, spec, times = read_schedule(rec)
  local due, pos, n = nil, 1, string.len(times)
  if every > 0 then
    due = anchor + every * (math.floor((now - anchor) / every) + 1)
  else
    while pos + 7 <= n do
      local t = struct.unpack('>d', times, pos)
      pos = pos + 8
      if t > now then due = t; break end
    end
  end
  if not due then
    redis.call('hset', K.schedules, key, schedule_record(seq, 1, every, anchor, field, tag, spec, ''))
    add_occurrence(K, key, field, tag, item_with_occurrence(payload, seq, 2), now + RESYNC_MS, now)
    return true
  end
  local rest = string.sub(times, pos)
  local nxt = (seq + 1) % 4294967296
  redis.call('hset', K.schedules, key, schedule_record(nxt, 0, every, anchor, field, tag, spec, rest))
  add_occurrence(K, key, field, tag, item_with_occurrence(payload, nxt), due, now)
  return every == 0 and string.len(rest) < 8 * REFILL_BELOW
end
-- An occurrence (`payload`, an item envelope) is handed out at `now`: schedule the next one, once.
-- Nothing when the schedule was cancelled or replaced, or when the next one was scheduled already
-- (this occurrence was handed out before: a pop's items given back after a crash, a redelivery, a
-- released message); the record's number then is not this one's. Returns whether the consumer
-- should list more cron times.
local function recur_next(K, payload, now)
  local key, seq = item_schedule(payload)
  if not key then return false end
  local rec = redis.call('hget', K.schedules, key)
  if not rec or struct.unpack('>I4', rec) ~= seq then return false end
  return recur_advance(K, key, rec, payload, now)
end
