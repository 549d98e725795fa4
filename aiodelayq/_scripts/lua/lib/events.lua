-- defines: events_on event_add
-- The queue's event stream (docs/operating.md, "Events"). While the controls hash holds 'events' (the
-- stream's cap, set_events), a script that changes an item appends an entry for it to K.event_stream
-- in the same call, with the field 'k' (the kind: offered, delivered, acked, nacked, released,
-- dead_lettered, expired, cancelled, rescheduled, requeued, deduplicated) and, where they apply, 'key'
-- (the item's key), 'id' (the message id, 16 bytes), 'g' (the group), 'n' (the delivery count) and 'r'
-- (a dead letter's reason number, lib/dead.lua). The entry's id is the server time. A call's first
-- entry trims the stream (MAXLEN ~ cap: whole nodes), its others do not: a trim per entry would cost
-- a quarter of its time, and the stream stays within the cap plus a node and one call's entries. Off,
-- nothing is written: a call reads the field once (HGET), at its first change.
local EVENTS_CAP = nil  -- the cap, or false while off (read once per call)
local EVENTS_TRIMMED = false
-- events_on(K): whether the stream is on (a caller with work per event skips it while off).
local function events_on(K)
  if EVENTS_CAP == nil then EVENTS_CAP = redis.call('hget', K.controls, 'events') end
  return EVENTS_CAP ~= false
end
-- event_add(K, kind, key, id, group, count, reason): one entry (nil fields left out); nothing while off.
local function event_add(K, kind, key, id, group, count, reason)
  if not events_on(K) then return end
  local args
  if EVENTS_TRIMMED then
    args = {'xadd', K.event_stream, '*', 'k', kind}
  else
    args = {'xadd', K.event_stream, 'MAXLEN', '~', EVENTS_CAP, '*', 'k', kind}
    EVENTS_TRIMMED = true
  end
  if key then args[#args + 1] = 'key'; args[#args + 1] = key end
  if id then args[#args + 1] = 'id'; args[#args + 1] = id end
  if group then args[#args + 1] = 'g'; args[#args + 1] = group end
  if count then args[#args + 1] = 'n'; args[#args + 1] = count end
  if reason then args[#args + 1] = 'r'; args[#args + 1] = reason end
  redis.call(unpack(args))
end
