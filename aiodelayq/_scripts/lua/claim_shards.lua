-- CLAIM_SHARDS: record the shards of a sharded queue under its name, or read what is recorded.
-- KEYS: controls destination timeout_set delay_list in_flight dead_letter key_index schedules tier_count
-- KEYS[1] controls hash of the name (its 'shards' field holds the record: '<count> spaced', or a count
-- alone for shards placed by the hash of their names), KEYS[2..9] the keys an ordinary queue of the
-- name would have: destination list, timeout zset, delay list, in-flight zset, dead-letter list, key
-- index hash, schedules hash, tier count
-- ARGV[1] the record this queue object would write (its count > 1 and placement: '<count> spaced')
-- returns: the name's record: the one found (ARGV[1] when this call recorded it), or 1 when nothing is
-- recorded and the name holds an ordinary queue (one of KEYS[2..9] exists, or the controls hash holds
-- a pause or a rate limit). Records only on a name without either, atomically: of two callers with
-- different counts, the second reads the first one's. A resend reads what its first run recorded.
local recorded = redis.call('hget', KEYS[1], 'shards')
if recorded then return recorded end
if redis.call('hlen', KEYS[1]) > 0 or redis.call('llen', KEYS[2]) > 0 or redis.call('zcard', KEYS[3]) > 0
    or redis.call('llen', KEYS[4]) > 0 or redis.call('zcard', KEYS[5]) > 0 or redis.call('llen', KEYS[6]) > 0
    or redis.call('hlen', KEYS[7]) > 0 or redis.call('hlen', KEYS[8]) > 0 or (tonumber(redis.call('get', KEYS[9])) or 0) > 0 then
  return 1
end
redis.call('hset', KEYS[1], 'shards', ARGV[1])
return ARGV[1]
