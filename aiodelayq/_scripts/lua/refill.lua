-- REFILL: list more upcoming due times of a cron schedule; restart it if it stalled.
-- KEYS: timeout_set delay_list key_index channel schedules
-- uses: lib/clock.lua lib/index.lua lib/item.lua lib/recur.lua
-- ARGV[1] key, ARGV[2] the occurrence payload the consumer was handed (an item envelope naming the
-- key and its number), ARGV[3] due times ('>d' each, ascending), computed by the client after the
-- last one the record lists (or after now), ARGV[4] the cron spec they were computed for
-- returns: the number of due times the record lists now, or false when the schedule is gone or
-- was replaced by one with another spec. Times at or before the record's last one, or its pending
-- occurrence's, are skipped, so concurrent or repeated refills list each time once. A stalled
-- record (its times had run out when its occurrence was handed out) whose number is the payload's
-- then schedules its next occurrence (replacing its resync), as the hand-out would have.
local key = ARGV[1]
local rec = redis.call('hget', K.schedules, key)
if not rec then return false end
local seq, stalled, every, anchor, field, tag, spec, times = read_schedule(rec)
if spec ~= ARGV[4] then return false end
local last = -1
if string.len(times) >= 8 then last = struct.unpack('>d', times, string.len(times) - 7) end
local kv = index_pairs(redis.call('hget', K.key_index, field))
if stalled == 0 and kv[1] == key and kv[2] then
  local pending = tonumber(redis.call('zscore', K.timeout_set, kv[2]))
  if pending and pending > last then last = pending end
end
local more = {}
for pos = 1, string.len(ARGV[3]) - 7, 8 do
  local t = struct.unpack('>d', ARGV[3], pos)
  if t > last then more[#more + 1] = string.sub(ARGV[3], pos, pos + 7); last = t end
end
times = times .. table.concat(more)
rec = schedule_record(seq, stalled, every, anchor, field, tag, spec, times)
redis.call('hset', K.schedules, key, rec)
local _, number = item_schedule(ARGV[2])
if stalled == 1 and number == seq then
  recur_advance(K, key, rec, ARGV[2], now_ms())
  local _, _, _, _, _, _, _, left = read_schedule(redis.call('hget', K.schedules, key))
  return string.len(left) / 8
end
return string.len(times) / 8
