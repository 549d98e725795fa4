-- READ_PAGE: one page of the walk that reads every pending payload.
-- KEYS: timeout_set
-- KEYS[1] timeout zset
-- ARGV[1] cursor score ('' = from the start), ARGV[2] cursor member, ARGV[3] page size
-- returns: {cursor score, cursor member, payloads...}: the payloads of this page's elements in zset
-- order (malformed elements skipped); the cursor is false, false when the walk is over. Read-only.
local out = {false, false}
local score, member = walk_page(KEYS[1], ARGV[1], ARGV[2], tonumber(ARGV[3]), function(v)
  local payload = parse(v)
  if payload then out[#out + 1] = payload end
end)
if score then out[1], out[2] = score, member end
return out
