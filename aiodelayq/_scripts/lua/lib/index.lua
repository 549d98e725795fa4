-- defines: element_tag index_pairs index_pair overflow_field pending_score index_find INDEX_V1 INDEX_OVERFLOW
-- uses: lib/lists.lua lib/parse.lua
-- Keys (aiodelayq/_producing/keyed.py). The key index hash maps a field to 0x01 (version) | pack_list({key,
-- element}): one pair per field, the key and its pending element. The field is the key's tag (the
-- first 8 bytes of its SHA-1, top bit set, computed by the client), carried in the element's id,
-- so a transfer finds the entry of what it moves without knowing the key: fast: the last 8 bytes
-- of the id (after the marker and the stamp); strict: the 8-byte id; legacy: the 8 bytes of the
-- double. Unkeyed fast elements have random bytes there with the top bit clear: a transfer can
-- drop the field of a moved fast element with the bit set without reading it (TRANSFER's cost).
-- A key whose tag is taken by another key with a pending element (a SHA-1 prefix collision) goes
-- to its overflow field ('#' .. SHA-1 hex of the key) with its fast element's tag bit cleared
-- (so no transfer ever drops the other key's field), and the field INDEX_OVERFLOW is set once:
-- from then on lookups that miss the tag also read the overflow field.
local INDEX_V1, INDEX_OVERFLOW = string.char(1), 'overflow'
local function element_tag(v)
  local n, b0 = string.len(v), string.byte(v, 1)
  if b0 == 8 and n >= 9 + LSZ and struct.unpack('L', v, 10) == n - 9 - LSZ then return string.sub(v, 2, 9) end
  if b0 == 20 and string.sub(v, 2, 5) == FAST_MAGIC then return string.sub(v, 14, 21) end
  return string.sub(v, 1, 8)
end
local function index_pairs(blob)
  if not blob or string.sub(blob, 1, 1) ~= INDEX_V1 then return {} end
  return unpack_list(string.sub(blob, 2))
end
local function index_pair(key, v)
  return INDEX_V1 .. struct.pack('>I4', string.len(key)) .. key .. struct.pack('>I4', string.len(v)) .. v
end
local function overflow_field(key)
  return '#' .. redis.sha1hex(key)
end
-- The score of a pending element, and the zset it waits in (the timeout zset, or K.grouped for a
-- grouped item when the script declares that key); nil: not pending.
local function pending_score(K, v)
  local score = redis.call('zscore', K.timeout_set, v)
  if score then return score, K.timeout_set end
  if K.grouped then
    score = redis.call('zscore', K.grouped, v)
    if score then return score, K.grouped end
  end
  return nil, nil
end
-- The pending element of `key`, its score (nil: not pending, a stale entry), its field and its
-- zset (pending_score); nil when the index has no entry for the key.
local function index_find(K, tag, key)
  local field, kv = tag, index_pairs(redis.call('hget', K.key_index, tag))
  if kv[1] ~= key and redis.call('hget', K.key_index, INDEX_OVERFLOW) then
    field = overflow_field(key)
    kv = index_pairs(redis.call('hget', K.key_index, field))
  end
  if kv[1] ~= key then return nil, nil, nil, nil end
  local score, zset = pending_score(K, kv[2])
  return kv[2], score, field, zset
end
