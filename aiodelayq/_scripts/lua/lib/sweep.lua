-- defines: sweep_index
-- uses: lib/index.lua
-- Stale index pairs (their element was moved by Redisson's transfer, or removed by payload) are
-- harmless; a few random entries are checked per keyed call so they do not pile up.
local function sweep_index(idx, zset, probes)
  for _, field in ipairs(redis.call('hrandfield', idx, probes)) do
    local kv = index_pairs(redis.call('hget', idx, field))
    if kv[2] and not redis.call('zscore', zset, kv[2]) then redis.call('hdel', idx, field) end
  end
end
