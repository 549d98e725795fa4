-- CONTAINS_PAGE: one page of the walk that looks for a payload among the pending elements.
-- KEYS: timeout_set
-- KEYS[1] timeout zset
-- ARGV[1] cursor score ('' = from the start), ARGV[2] cursor member, ARGV[3] page size,
-- ARGV[4] payload
-- returns: {1} if an element of this page carries the payload; else {0, cursor score, cursor
-- member} to go on from, or {0} when the walk is over. Read-only.
local match = matcher({ARGV[4]})
local found = false
local score, member = walk_page(KEYS[1], ARGV[1], ARGV[2], tonumber(ARGV[3]), function(v)
  found = match(v) ~= nil
  return found
end)
if found then return {1} end
if score then return {0, score, member} end
return {0}
