-- TRANSFER: move due elements to the destination list; return expired hand-off leases' items.
-- KEYS: destination timeout_set delay_list dead_letter handoff handoff_leases key_index tier_index tier_count
-- KEYS[1] destination list, KEYS[2] timeout zset, KEYS[3] delay list, KEYS[4] dead-letter list,
-- KEYS[5] hand-off hash, KEYS[6] hand-off leases zset, KEYS[7] key index hash, KEYS[8] tier index
-- zset, KEYS[9] tier count (promoted buckets: lib/tiers.lua)
-- ARGV[1] at most |ARGV[1]| elements are moved; negative: the reply also carries their lateness
--         (sent only while a metrics sink is installed; see transfer())
-- returns: transfer()'s reply (above, 7 entries), then the length of the destination list
-- (consumers need not look when it is 0): 8 entries; for a negative ARGV[1] a 9th, the list of the
-- moved items' lateness (ms, integers). Readers take the first 8 and an optional 9th.
local r, late = transfer(KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9],
                         tonumber(ARGV[1]))
r[#r + 1] = redis.call('llen', KEYS[1])
if late then r[#r + 1] = late end
return r
