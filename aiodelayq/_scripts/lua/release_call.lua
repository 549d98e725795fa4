-- RELEASE_CALL: undo a receive nobody saw, by its call id.
-- KEYS: in_flight destination calls call_replies channel controls groups group_ready event_stream
-- uses: lib/calls.lua lib/clock.lua lib/messages.lua lib/wake.lua
-- ARGV[1] the call id of a RECEIVE whose caller was cancelled (or whose reply was lost for good)
-- returns: how many messages were released (their delivery undone, see release()); when any were, it
-- publishes now on the channel, so every process's receivers look again.
-- If that RECEIVE has not run (yet), its id is remembered with an empty record, so a late arrival
-- of it on a dropped connection receives nothing. First deliveries go back to the head of the
-- destination in the order the RECEIVE popped them: received() lists them in that order (their ids
-- end in their index, big-endian), and each release LPUSHes, so the last goes first.
local now = now_ms()
local n = 0
if first_run(K, ARGV[1]) then
  local got = received(K, redis.call('hget', K.call_replies, ARGV[1]), ARGV[1])
  for i = #got, 1, -1 do
    release(K, got[i], now)
  end
  n = #got
  redis.call('hset', K.call_replies, ARGV[1], '')
  if n > 0 then
    wake_consumers(K, now)
  end
else
  remember(K, ARGV[1], now, '')
end
return n
