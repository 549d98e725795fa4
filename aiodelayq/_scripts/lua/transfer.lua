-- TRANSFER: move due elements to the destination list; return expired hand-off leases' items.
-- KEYS: destination timeout_set delay_list dead_letter handoff handoff_leases key_index controls tier_index tier_count grouped groups group_ready event_stream
-- uses: lib/transfer.lua
-- A 'shards' field in the controls hash: the name is a sharded queue's, whose items are in its
-- shards: an error reply 'SHARDED <count>', so an ordinary queue object never opens on it.
-- ARGV[1] at most |ARGV[1]| elements are moved; negative: the reply also carries their lateness
--         (sent only while a metrics sink is installed; see transfer())
-- returns: transfer()'s reply (above, 7 entries), then the length of the destination list plus
-- the groups' ready list (consumers need not look when it is 0): 8 entries; for a negative ARGV[1] a 9th, the list of the
-- moved items' lateness (ms, integers). Readers take the first 8 and an optional 9th.
local sharded = redis.call('hget', K.controls, 'shards')
if sharded then return redis.error_reply('SHARDED ' .. sharded) end
local r, late = transfer(K, tonumber(ARGV[1]))
r[#r + 1] = redis.call('llen', K.destination) + redis.call('llen', K.group_ready)
if late then r[#r + 1] = late end
return r
