-- KEY_TYPES: the type of every key of the queue, to name a key another program wrote (read-only).
-- KEYS: destination timeout_set delay_list dead_letter in_flight handoff handoff_leases calls call_replies key_index controls schedules tier_index tier_count nacked grouped groups group_ready dedupe_windows dedupe_dues event_stream
-- ARGV: (none)
-- returns: TYPE of each key, in order ('none' for a key that does not exist). O(1) each.
local types = {}
for i, key in ipairs(KEYS) do
  types[i] = redis.call('type', key)['ok']
end
return types
