-- defines: TIER_CURSOR tier_page tier_resume pending_page
-- uses: lib/tiers.lua lib/walk.lua
-- The tier's part of a pending walk, after the zset's (lib/walk.lua): the buckets in index order
-- (promotion time, then start), each from its head, in the order its entries were offered, read
-- with LRANGE in batches sized as walk_page sizes its own. The cursor is TIER_CURSOR alone (the
-- tier's beginning) or TIER_CURSOR .. '<promotion time>:<start>:<position>' (the bucket and the
-- position after the entry read last, counted from the head), with the entry read last as its
-- member ('' when the position is exact as it is). Promotion pops entries from a bucket's tail and
-- offers append there, so positions counted from the head stay put; a removal before the position
-- shifts what follows by one, which the entry read last tells (LINDEX, else LPOS; gone from the
-- bucket: it was removed, or promoted with everything after it, and the position is one less).
-- A bucket that left the index (promoted, cleared, emptied) is followed by the next one
-- (start_rank). So an entry that stays in the tier during the whole walk is seen once; one that is
-- promoted (within one bucket width of its due time), added or removed meanwhile may or may not be.
local TIER_CURSOR = 'T'
-- Where a page resumes: the rank of the bucket in the index and the position in it.
local function tier_resume(K, cursor, last)
  if cursor == TIER_CURSOR then return 0, 0 end
  local promotion, start, at = string.match(cursor, '^T([^:]+):([^:]+):(%d+)$')
  local pos = tonumber(at)
  local score = redis.call('zscore', K.tier_index, start)
  if not score or tonumber(score) ~= tonumber(promotion) then return start_rank(K.tier_index, promotion, start), 0 end
  if last ~= '' and pos > 0 then
    local key = tier_bucket(K, start)
    if redis.call('lindex', key, pos - 1) ~= last then
      local found = redis.call('lpos', key, last)
      pos = found and found + 1 or pos - 1
    end
  end
  return redis.call('zrank', K.tier_index, start), pos
end
-- One page of the tier's walk from `cursor` and `last` (see above): calls fn(element, due ms,
-- bucket key, entry) for at most `limit` entries and about PAGE_BYTES bytes (at least one); fn
-- returning true ends the page there. fn must not change the buckets (positions would shift):
-- collect, then write. Returns the cursor and member after the last entry given to fn, or nil when
-- the tier ended first.
local function tier_page(K, cursor, last, limit, fn)
  local rank, pos = tier_resume(K, cursor, last)
  local seen, bytes = 0, 0
  while true do
    local bucket = redis.call('zrange', K.tier_index, rank, rank, 'WITHSCORES')
    if #bucket == 0 then return nil end
    local start, promotion = bucket[1], bucket[2]
    local key, base, want = tier_bucket(K, start), tonumber(start), 1
    while true do
      local batch = redis.call('lrange', key, pos, pos + want - 1)
      for _, e in ipairs(batch) do
        pos = pos + 1
        seen = seen + 1
        bytes = bytes + string.len(e)
        local due, v = tier_entry(e, base)
        if fn(v, due, key, e) or seen >= limit or bytes >= PAGE_BYTES then
          return TIER_CURSOR .. promotion .. ':' .. start .. ':' .. pos, e
        end
      end
      if #batch < want then break end
      want = math.max(1, math.min(CHUNK, limit - seen, math.floor((PAGE_BYTES - bytes) * seen / bytes)))
    end
    rank, pos = rank + 1, 0
  end
end
-- One page of a pending walk: the zset's (walk_page, fn_zset(v) per element) until it ends, then the
-- tier's (tier_page, fn_tier(v, due, key, entry) per entry); returns the cursor to go on from (score,
-- member), or nil when the walk is over. The page that ends the zset's part ends there.
local function pending_page(K, score, member, limit, fn_zset, fn_tier)
  if string.sub(score, 1, 1) == TIER_CURSOR then return tier_page(K, score, member, limit, fn_tier) end
  local next_score, next_member = walk_page(K.timeout_set, score, member, limit, fn_zset)
  if not next_score and redis.call('zcard', K.tier_index) > 0 then return TIER_CURSOR, '' end
  return next_score, next_member
end
