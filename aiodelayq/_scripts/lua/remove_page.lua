-- REMOVE_PAGE: one page of the walk that removes pending elements by payload, once per call id: the zset's, then the tier's.
-- KEYS: timeout_set delay_list calls call_replies tier_index tier_count
-- uses: lib/calls.lua lib/clock.lua lib/lists.lua lib/tier_walk.lua lib/tiers.lua lib/walk.lua
-- ARGV[1] call id (16 bytes, the same for a resend of this page), ARGV[2] cursor score ('' = from
-- the start; 'T...' = in the tier, lib/tier_walk.lua), ARGV[3] cursor member, ARGV[4] page size,
-- ARGV[5] '1': stop at the first match, '0': every match; ARGV[6] '1' for a resend, '0' for the
-- first attempt; ARGV[7..] payloads
-- returns: {removed, cursor score, cursor member}; the cursor is false, false when the walk is over
-- (with '1', a page that removed one ends the walk too). A page ends where the zset ends (the next
-- starts the tier).
-- Each match in the zset is ZREMed; a non-fast one (Redisson's, strict, legacy) is also LREMed
-- from the delay list: O(list), Redisson's cost. A match in the tier is LREMed from its bucket
-- (O(bucket)); an emptied bucket leaves the index, and the count goes down. The cursor is moved
-- back by this page's removals from its bucket, so the next page misses nothing. Removals come
-- first, then the call is remembered: under maxmemory only a script's first write is refused, and
-- deletions are never refused.
-- The reply is remembered under the call id for the call window when the page removed something,
-- and always by a resend: a later run of the id (a resend, or the first attempt arriving late on a
-- dropped connection) answers as the remembered run did and removes nothing. A first attempt that
-- removed nothing only read and leaves no trace (a walk for an absent item writes nothing).
if first_run(K, ARGV[1]) then
  local r = unpack_list(redis.call('hget', K.call_replies, ARGV[1]) or '')
  if #r == 3 then
    if r[2] == '' then return {tonumber(r[1]), false, false} end
    return {tonumber(r[1]), r[2], r[3]}
  end
end
local payloads = {}
for i = 7, #ARGV do payloads[#payloads + 1] = ARGV[i] end
local match = matcher(payloads)
local first_only = ARGV[5] == '1'
local hits, listed, tiered = {}, {}, {}
local score, member = pending_page(K, ARGV[2], ARGV[3], tonumber(ARGV[4]), function(v)
  local payload, fast = match(v)
  if payload == nil then return false end
  hits[#hits + 1] = v
  if not fast then listed[#listed + 1] = v end
  return first_only
end, function(v, _, key, e)
  if match(v) == nil then return false end
  tiered[#tiered + 1] = {key, e}
  return first_only
end)
for _, v in ipairs(hits) do redis.call('zrem', K.timeout_set, v) end
for _, v in ipairs(listed) do redis.call('lrem', K.delay_list, 1, v) end
if #tiered > 0 then
  local cursor_key = score and score ~= TIER_CURSOR
    and tier_bucket(K, string.match(score, '^T[^:]+:([^:]+):')) or nil
  local behind = 0
  for _, hit in ipairs(tiered) do
    redis.call('lrem', hit[1], 1, hit[2])
    if hit[1] == cursor_key then behind = behind + 1 end
    if hit[2] == member then member = '' end  -- the position alone is exact once moved back
    if redis.call('llen', hit[1]) == 0 then
      redis.call('zrem', K.tier_index, string.match(hit[1], '^aiodelayq_tier_(%d+)'))
    end
  end
  if behind > 0 then
    local head, at = string.match(score, '^(.*:)(%d+)$')
    score = head .. (tonumber(at) - behind)
  end
  tier_forget(K, #tiered)
end
local removed = #hits + #tiered
if removed > 0 or ARGV[6] == '1' then
  remember(K, ARGV[1], now_ms(), pack_list({tostring(removed), score or '', member or ''}))
end
return {removed, score or false, member or false}
