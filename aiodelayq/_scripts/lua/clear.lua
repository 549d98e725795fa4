-- CLEAR: drop every pending element: the pending keys, then the tier's buckets, a page at a time.
-- KEYS: delay_list timeout_set key_index schedules tier_index tier_count grouped
-- uses: lib/chunked.lua lib/tiers.lua
-- ARGV[1] '1': the first page (also UNLINKs the delay list, the zset, the key index, the
-- schedules and the pending grouped items), '0': a later page (buckets only)
-- returns: how many buckets are left in the tier index (the caller sends pages until 0).
-- Each page UNLINKs (freed in the background) up to CLEAR_BUCKETS buckets, the first in index
-- order, drops them from the index and their entries from the count (the count goes when the
-- index is empty). Idempotent: a resend drops what is there. Items offered while the pages run may
-- stay (as after an UNLINK followed by an offer).
local CLEAR_BUCKETS = 500
if ARGV[1] == '1' then redis.call('unlink', K.delay_list, K.timeout_set, K.key_index, K.schedules, K.grouped) end
local starts = redis.call('zrange', K.tier_index, 0, CLEAR_BUCKETS - 1)
local gone = 0
for _, start in ipairs(starts) do
  local key = tier_bucket(K, start)
  local n = redis.pcall('llen', key)
  if type(n) == 'number' then
    gone = gone + n
    redis.call('unlink', key)
  end
end
chunked('zrem', K.tier_index, nil, starts)
local left = redis.call('zcard', K.tier_index)
if left == 0 then redis.call('unlink', K.tier_count) else tier_forget(K, gone) end
return left
