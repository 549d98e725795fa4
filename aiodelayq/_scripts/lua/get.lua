-- GET: the pending element of a key and its due time.
-- KEYS: timeout_set key_index grouped
-- uses: lib/index.lua lib/parse.lua
-- ARGV[1] key, ARGV[2] its tag
-- returns: {payload, due ms (text)} of the pending item of the key, or false (none, or a
-- malformed element). Read-only.
local v, score = index_find(K, ARGV[2], ARGV[1])
if not score then return false end
local payload = parse(v)
if not payload then return false end
return {payload, score}
