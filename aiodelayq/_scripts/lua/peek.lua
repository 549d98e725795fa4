-- PEEK: the soonest-due pending elements with their due times and keys.
-- KEYS: timeout_set key_index
-- KEYS[1] timeout zset, KEYS[2] key index hash
-- ARGV[1] at most this many elements (the soonest due)
-- returns: {element, due ms (text), payload or false (malformed), key or false, ...} in due order:
-- four entries per element. The key is the one whose index entry holds this very element (an item
-- whose key collided into an overflow field reads as unkeyed). Read-only.
local out = {}
local indexed = redis.call('hlen', KEYS[2]) > 0
local head = redis.call('zrange', KEYS[1], 0, tonumber(ARGV[1]) - 1, 'WITHSCORES')
for i = 1, #head, 2 do
  local v = head[i]
  local payload = parse(v)
  local key = false
  if payload and indexed then
    local kv = index_pairs(redis.call('hget', KEYS[2], element_tag(v)))
    if kv[2] == v then key = kv[1] end
  end
  out[#out + 1] = v
  out[#out + 1] = head[i + 1]
  out[#out + 1] = payload or false
  out[#out + 1] = key
end
return out
