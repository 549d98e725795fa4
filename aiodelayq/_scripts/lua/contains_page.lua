-- CONTAINS_PAGE: one page of the walk that looks for a payload among the pending elements: the zset's, then the tier's.
-- KEYS: timeout_set tier_index
-- KEYS[1] timeout zset, KEYS[2] tier index zset
-- ARGV[1] cursor score ('' = from the start; 'T...' = in the tier, lib/tier_walk.lua), ARGV[2]
-- cursor member, ARGV[3] page size, ARGV[4] payload
-- returns: {1} if an element of this page carries the payload; else {0, cursor score, cursor
-- member} to go on from, or {0} when the walk is over. A page ends where the zset ends (the next
-- starts the tier). Read-only.
local match = matcher({ARGV[4]})
local found = false
local function look(v)
  found = match(v) ~= nil
  return found
end
local score, member
if string.sub(ARGV[1], 1, 1) == TIER_CURSOR then
  score, member = tier_page(KEYS[2], ARGV[1], ARGV[2], tonumber(ARGV[3]), look)
else
  score, member = walk_page(KEYS[1], ARGV[1], ARGV[2], tonumber(ARGV[3]), look)
  if not score and redis.call('zcard', KEYS[2]) > 0 then score, member = TIER_CURSOR, '' end
end
if found then return {1} end
if score then return {0, score, member} end
return {0}
