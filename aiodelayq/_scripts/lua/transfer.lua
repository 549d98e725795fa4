-- TRANSFER: move due elements to the destination list; return expired hand-off leases' items.
-- KEYS: destination timeout_set delay_list dead_letter handoff handoff_leases key_index controls tier_index tier_count
-- uses: lib/transfer.lua
-- KEYS[1] destination list, KEYS[2] timeout zset, KEYS[3] delay list, KEYS[4] dead-letter list,
-- KEYS[5] hand-off hash, KEYS[6] hand-off leases zset, KEYS[7] key index hash, KEYS[8] controls
-- hash (a 'shards' field there: the name is a sharded queue's, whose items are in its shards: an
-- error reply 'SHARDED <count>', so an ordinary queue object never opens on it), KEYS[9] tier index
-- zset, KEYS[10] tier count (promoted buckets: lib/tiers.lua)
-- ARGV[1] at most |ARGV[1]| elements are moved; negative: the reply also carries their lateness
--         (sent only while a metrics sink is installed; see transfer())
-- returns: transfer()'s reply (above, 7 entries), then the length of the destination list
-- (consumers need not look when it is 0): 8 entries; for a negative ARGV[1] a 9th, the list of the
-- moved items' lateness (ms, integers). Readers take the first 8 and an optional 9th.
local sharded = redis.call('hget', KEYS[8], 'shards')
if sharded then return redis.error_reply('SHARDED ' .. sharded) end
local r, late = transfer(KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[9], KEYS[10],
                         tonumber(ARGV[1]))
r[#r + 1] = redis.call('llen', KEYS[1])
if late then r[#r + 1] = late end
return r
