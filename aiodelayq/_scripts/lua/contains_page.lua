-- CONTAINS_PAGE: one page of the walk that looks for a payload among the pending elements: the zset's, then the tier's.
-- KEYS: timeout_set tier_index
-- uses: lib/tier_walk.lua lib/walk.lua
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
local score, member = pending_page(K, ARGV[1], ARGV[2], tonumber(ARGV[3]), look, look)
if found then return {1} end
if score then return {0, score, member} end
return {0}
