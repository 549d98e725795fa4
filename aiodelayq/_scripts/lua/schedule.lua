-- SCHEDULE: start (or replace) the recurring item of a key: its record and its first occurrence.
-- KEYS: timeout_set delay_list key_index channel schedules
-- uses: lib/clock.lua lib/index.lua lib/issue.lua lib/item.lua lib/recur.lua
-- ARGV[1] key, ARGV[2] its tag, ARGV[3] the occurrence payload (an item envelope naming the key),
-- ARGV[4] every ms ('0': a cron schedule), ARGV[5] a cron schedule's spec (expression, newline,
-- time zone; '' for every), ARGV[6] its upcoming due times ('>d' each, ascending; '' for every),
-- ARGV[7] issue time (server ms as the client estimates it, '' = none), ARGV[8] a random number
-- below 2^31: a new record's first occurrence number (numbers are never reused for a key, so an
-- occurrence of a cancelled schedule cannot pass for one of a later schedule of that key)
-- returns: {the first occurrence's due time (ms), the server's clock (ms)}; the due time is 0 when
-- no listed cron time is after now (nothing written: the client lists again from the clock
-- returned). The key's pending item, if any, is replaced. A schedule replaced by another
-- keeps no occurrence of its own: the new record's number is the next one, so an occurrence of the
-- old one that is ready or in flight continues nothing. Resending it is harmless: it replaces the
-- schedule again.
local now = now_ms()
local base = issue_base(ARGV[7], now)
local key, tag, every = ARGV[1], ARGV[2], tonumber(ARGV[4])
local due, times = nil, ''
if every > 0 then
  due = base + every
else
  local blob = ARGV[6]
  for pos = 1, string.len(blob) - 7, 8 do
    local t = struct.unpack('>d', blob, pos)
    if t > now then due, times = t, string.sub(blob, pos + 8); break end
  end
  if not due then return {0, now} end
end
local rec = redis.call('hget', K.schedules, key)
local seq = rec and (struct.unpack('>I4', rec) + 1) % 4294967296 or tonumber(ARGV[8])
-- The key's index field: its tag, unless another key holds the tag with a pending element (a SHA-1
-- prefix collision): then its overflow field, with the element's tag bit cleared (as OFFER does).
local field = tag
local kv = index_pairs(redis.call('hget', K.key_index, tag))
if kv[1] ~= key then
  local spill = overflow_field(key)
  if index_pairs(redis.call('hget', K.key_index, spill))[1] == key then
    field = spill
  elseif kv[1] and kv[2] and redis.call('zscore', K.timeout_set, kv[2]) then
    field = spill
    redis.call('hset', K.key_index, INDEX_OVERFLOW, '1')
  end
end
local etag = tag
if field ~= tag then etag = string.char(string.byte(tag, 1) % 128) .. string.sub(tag, 2) end
redis.call('hset', K.schedules, key, schedule_record(seq, 0, every, base, field, etag, ARGV[5], times))
add_occurrence(K, key, field, etag, item_with_occurrence(ARGV[3], seq), due, now)
return {due, now}
