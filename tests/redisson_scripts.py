"""Redisson's own Lua scripts, to check that Java and Python share a queue.

The legacy (``dLc0``, Redisson < 3.21.1) offer and transfer scripts are quoted verbatim from the
MONITOR traces in ``shared/seeds/001_98f0495c7539edb4.txt``. Redisson >= 3.21.1 runs the same
scripts with the element packed as ``struct.pack('Bc0Lc0', #id, id, #payload, payload)``
(``shared/design/redisson-delayed-queue.md``); the current variants below are derived from the
legacy ones by that substitution only. ``REMOVE_*`` follows the design doc's description of
``remove(item)``: scan the delay list, on the first payload match ZREM + LREM.
"""

from __future__ import annotations

# KEYS: name, timeout set, delay list, channel; ARGV: due ms, random long, payload
OFFER_LEGACY = (
    "local value = struct.pack('dLc0', tonumber(ARGV[2]), string.len(ARGV[3]), ARGV[3]);"
    "redis.call('zadd', KEYS[2], ARGV[1], value);redis.call('rpush', KEYS[3], value);"
    "local v = redis.call('zrange', KEYS[2], 0, 0); if v[1] == value then "
    "redis.call('publish', KEYS[4], ARGV[1]); end;"
)

# KEYS: name, timeout set, delay list; ARGV: now ms, limit
TRANSFER_LEGACY = (
    "local expiredValues = redis.call('zrangebyscore', KEYS[2], 0, ARGV[1], 'limit', 0, ARGV[2]); "
    "if #expiredValues > 0 then for i, v in ipairs(expiredValues) do "
    "local randomId, value = struct.unpack('dLc0', v);redis.call('rpush', KEYS[1], value);"
    "redis.call('lrem', KEYS[3], 1, v);end; redis.call('zrem', KEYS[2], unpack(expiredValues));end; "
    "local v = redis.call('zrange', KEYS[2], 0, 0, 'WITHSCORES'); if v[1] ~= nil then return v[2]; end "
    "return nil;"
)

# Same KEYS/ARGV, but ARGV[2] of OFFER is the 8 random bytes.
OFFER_CURRENT = OFFER_LEGACY.replace(
    "struct.pack('dLc0', tonumber(ARGV[2]), string.len(ARGV[3]), ARGV[3])",
    "struct.pack('Bc0Lc0', string.len(ARGV[2]), ARGV[2], string.len(ARGV[3]), ARGV[3])",
)
TRANSFER_CURRENT = TRANSFER_LEGACY.replace("struct.unpack('dLc0', v)", "struct.unpack('Bc0Lc0', v)")

# KEYS: delay list, timeout set; ARGV: payload. Returns 1 if removed.
_REMOVE = (
    "local s = redis.call('llen', KEYS[1]);"
    "for i = 0, s-1, 1 do local v = redis.call('lindex', KEYS[1], i);"
    "local randomId, value = struct.unpack('FMT', v);"
    "if ARGV[1] == value then redis.call('zrem', KEYS[2], v);redis.call('lrem', KEYS[1], 1, v);return 1;end; "
    "end;return 0;"
)
REMOVE_LEGACY = _REMOVE.replace("FMT", "dLc0")
REMOVE_CURRENT = _REMOVE.replace("FMT", "Bc0Lc0")
