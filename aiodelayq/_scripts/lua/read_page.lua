-- READ_PAGE: one page of the walk that reads every pending payload: the zset's, then the tier's.
-- KEYS: timeout_set tier_index
-- uses: lib/parse.lua lib/tier_walk.lua
-- ARGV[1] cursor score ('' = from the start; 'T...' = in the tier, lib/tier_walk.lua), ARGV[2]
-- cursor member, ARGV[3] page size
-- returns: {cursor score, cursor member, payloads...}: the payloads of this page's elements in zset
-- order, then the tier's entries in bucket order (malformed elements skipped); the cursor is false,
-- false when the walk is over. A page ends where the zset ends (the next starts the tier). Read-only.
local out = {false, false}
local function read(v)
  local payload = parse(v)
  if payload then out[#out + 1] = payload end
end
local score, member = pending_page(K, ARGV[1], ARGV[2], tonumber(ARGV[3]), read, read)
if score then out[1], out[2] = score, member end
return out
