-- PEEK: the soonest-due pending elements with their due times and keys, the tier's and the grouped included.
-- KEYS: timeout_set key_index tier_index grouped
-- uses: lib/index.lua lib/parse.lua lib/tiers.lua lib/walk.lua
-- ARGV[1] at most this many elements (the soonest due)
-- returns: {element, due ms (text), payload or false (malformed), key or false, ...} in due order
-- (then element bytes, as the zset orders them): four entries per element. The key is the one
-- whose index entry holds this very element (an item whose key collided into an overflow field
-- reads as unkeyed; tiered items have none). Read-only.
-- The tier's buckets are read in index order, each whole from its head, while the n soonest found
-- so far are not all due before the next bucket's start; at most PEEK_TIER entries in all (a
-- bucket holds its entries in the order offered: in a larger one, the soonest among the first
-- PEEK_TIER offered are seen).
local PEEK_TIER = 1000
local n = tonumber(ARGV[1])
local indexed = redis.call('hlen', K.key_index) > 0
local head = redis.call('zrange', K.timeout_set, 0, n - 1, 'WITHSCORES')
local function sooner(a, b)
  if a[2] ~= b[2] then return a[2] < b[2] end
  return bytes_lt(a[1], b[1])
end
-- Pending grouped items (lib/groups.lua) are in their own zset: merged into the head, as one zset.
local grouped = redis.call('zrange', K.grouped, 0, n - 1, 'WITHSCORES')
if #grouped > 0 then
  local both = {}
  for _, z in ipairs({head, grouped}) do
    for p = 1, #z, 2 do both[#both + 1] = {z[p], tonumber(z[p + 1]), z[p + 1]} end
  end
  table.sort(both, sooner)
  head = {}
  for p = 1, math.min(n, #both) do head[2 * p - 1], head[2 * p] = both[p][1], both[p][3] end
end
local tiered = {}  -- {element, due} of the tier's entries read
local rank, before = 0, 0  -- before: the zset's elements due before the current bucket's start
while #tiered < PEEK_TIER do
  local bucket = redis.call('zrange', K.tier_index, rank, rank)
  if #bucket == 0 then break end
  local start = tonumber(bucket[1])
  while before < #head / 2 and tonumber(head[2 * before + 2]) < start do before = before + 1 end
  if before + #tiered >= n then break end
  for _, e in ipairs(redis.call('lrange', tier_bucket(K, bucket[1]), 0, PEEK_TIER - #tiered - 1)) do
    local due, v = tier_entry(e, start)
    tiered[#tiered + 1] = {v, due}
  end
  rank = rank + 1
end
table.sort(tiered, sooner)
local out = {}
local function emit(v, due, from_zset)
  local payload = parse(v)
  local key = false
  if payload and indexed and from_zset then
    local kv = index_pairs(redis.call('hget', K.key_index, element_tag(v)))
    if kv[2] == v then key = kv[1] end
  end
  out[#out + 1] = v
  out[#out + 1] = due
  out[#out + 1] = payload or false
  out[#out + 1] = key
end
local i, j = 1, 1
while #out < 4 * n and (i <= #head or j <= #tiered) do
  local z = i <= #head and {head[i], tonumber(head[i + 1])} or nil
  if z and (j > #tiered or not sooner(tiered[j], z)) then
    emit(head[i], head[i + 1], true)
    i = i + 2
  else
    emit(tiered[j][1], string.format('%d', tiered[j][2]), false)
    j = j + 1
  end
end
return out
