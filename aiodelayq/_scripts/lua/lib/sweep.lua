-- defines: sweep_index
-- uses: lib/index.lua
-- Stale index pairs (their element was moved by Redisson's transfer, or removed by payload) are
-- harmless; a few random entries are checked per keyed call so they do not pile up.
local function sweep_index(K, probes)
  for _, field in ipairs(redis.call('hrandfield', K.key_index, probes)) do
    local kv = index_pairs(redis.call('hget', K.key_index, field))
    if kv[2] and not pending_score(K, kv[2]) then redis.call('hdel', K.key_index, field) end
  end
end
