-- defines: CHUNK PAGE_BYTES bytes_lt matcher start_rank walk_page
-- uses: lib/parse.lua
local PAGE_BYTES = 262144
local CHUNK = 128
-- a < b in byte order, as the zset orders members of equal score (memcmp). Lua's own '<' uses the
-- server's locale collation (strcoll), which need not be byte order.
local function bytes_lt(a, b)
  local na, nb = string.len(a), string.len(b)
  for i = 1, math.min(na, nb) do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then return x < y end
  end
  return na < nb
end
-- The rank of the first element after the cursor (score as text, member); 0 without a cursor
-- (score ''). If the cursor element is still there, the rank after it; else (it fell due or was
-- removed) a binary search for the first member after it among the elements of its score.
local function start_rank(zset, score, member)
  if score == '' then return 0 end
  local s = redis.call('zscore', zset, member)
  if s and tonumber(s) == tonumber(score) then return redis.call('zrank', zset, member) + 1 end
  local lo = redis.call('zcount', zset, '-inf', '(' .. score)
  local hi = redis.call('zcount', zset, '-inf', score)
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    if bytes_lt(member, redis.call('zrange', zset, mid, mid)[1]) then hi = mid else lo = mid + 1 end
  end
  return lo
end
-- One page of the walk: calls fn(element) for the elements after the cursor, in zset order, at
-- most `limit` of them and about PAGE_BYTES bytes (at least one); fn returning true ends the page
-- there. fn must not change the zset (ranks would shift): collect, then write. Returns the cursor
-- of the last element given to fn (score text, member), or nil when the zset ended first.
-- Elements are fetched in batches sized by the average element so far (the first batch is one
-- element), so a page of large elements does not copy many more than it uses.
local function walk_page(zset, score, member, limit, fn)
  local rank = start_rank(zset, score, member)
  local seen, bytes, want = 0, 0, 1
  while true do
    local batch = redis.call('zrange', zset, rank, rank + want - 1)
    for _, v in ipairs(batch) do
      seen = seen + 1
      bytes = bytes + string.len(v)
      if fn(v) or seen >= limit or bytes >= PAGE_BYTES then return redis.call('zscore', zset, v), v end
    end
    if #batch < want then return nil end
    rank = rank + #batch
    want = math.max(1, math.min(CHUNK, limit - seen, math.floor((PAGE_BYTES - bytes) * seen / bytes)))
  end
end
-- A test for "v carries one of these payloads": returns the payload and is_fast, or nil. The
-- element's length is checked first (header sizes of the three formats), so most elements are
-- never unpacked.
local function matcher(payloads)
  local wanted, sizes = {}, {}
  for _, p in ipairs(payloads) do
    wanted[p] = true
    for _, h in ipairs({8 + LSZ, 9 + LSZ, 21 + LSZ}) do sizes[string.len(p) + h] = true end
  end
  return function(v)
    if not sizes[string.len(v)] then return nil end
    local payload, fast = parse(v)
    if payload and wanted[payload] then return payload, fast end
    return nil
  end
end
