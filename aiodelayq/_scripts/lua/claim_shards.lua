-- CLAIM_SHARDS: record the shards of a sharded queue under its name, or read what is recorded.
-- KEYS: controls destination timeout_set delay_list in_flight dead_letter key_index schedules tier_count
-- The controls hash's 'shards' field holds the record: '<count> spaced', or a count alone for shards
-- placed by the hash of their names; the other KEYS are those an ordinary queue of the name would have.
-- ARGV[1] the record this queue object would write (its count > 1 and placement: '<count> spaced')
-- returns: the name's record: the one found (ARGV[1] when this call recorded it), or 1 when nothing is
-- recorded and the name holds an ordinary queue (one of its other KEYS exists, or the controls hash holds
-- a pause or a rate limit). Records only on a name without either, atomically: of two callers with
-- different counts, the second reads the first one's. A resend reads what its first run recorded.
local recorded = redis.call('hget', K.controls, 'shards')
if recorded then return recorded end
if redis.call('hlen', K.controls) > 0 or redis.call('llen', K.destination) > 0
    or redis.call('zcard', K.timeout_set) > 0 or redis.call('llen', K.delay_list) > 0
    or redis.call('zcard', K.in_flight) > 0 or redis.call('llen', K.dead_letter) > 0
    or redis.call('hlen', K.key_index) > 0 or redis.call('hlen', K.schedules) > 0
    or (tonumber(redis.call('get', K.tier_count)) or 0) > 0 then
  return 1
end
redis.call('hset', K.controls, 'shards', ARGV[1])
return ARGV[1]
