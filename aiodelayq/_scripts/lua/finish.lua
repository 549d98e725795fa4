-- FINISH: settle a pop's hand-off entry: forget the items taken, return or dead-letter the others.
-- KEYS: destination handoff handoff_leases dead_letter channel controls groups group_ready event_stream
-- uses: lib/chunked.lua lib/clock.lua lib/dead.lua lib/events.lua lib/groups.lua lib/handoff.lua lib/wake.lua
-- ARGV[1] pop call id, ARGV[2] plan: one letter per popped item, in order: 'd' handed to a caller
--         (forget it), 'x' undecodable (to the dead-letter list), 'r' nobody took it (back to the
--         head of the destination, or of the groups' ready list); or '*': return them all (the pop's reply never came).
-- ARGV[3] lease ms (for the tombstone below)
-- returns: how many items the plan was applied to; 0 if the entry was already finished (a resend).
-- A '*' that finds no entry leaves an empty one (a tombstone, cleared when its lease ends): the
-- pop may still be on its way on a dropped connection, and must then pop nothing.
local blob = redis.call('hget', K.handoff, ARGV[1])
if not blob then
  if ARGV[2] == '*' then
    local now = now_ms()
    redis.call('hset', K.handoff, ARGV[1], '')
    redis.call('zadd', K.handoff_leases, now + tonumber(ARGV[3]), ARGV[1])
  end
  return 0
end
if blob == '' then return 0 end
-- A plan of only 'd' (every item handed out) forgets the entry without reading it.
local count = string.len(ARGV[2])
if string.find(ARGV[2], '[^d]') then
  local items = handoff_items(blob)
  local back, dead = {}, {}
  for i, v in ipairs(items) do
    local c = ARGV[2] == '*' and 'r' or string.sub(ARGV[2], i, i)
    if c == 'x' then
      dead[#dead + 1] = dead_entry(DEAD_UNDECODABLE, 1, now_ms(), v)
      event_add(K, 'dead_lettered', nil, nil, group_of(v), 1, DEAD_UNDECODABLE)
    elseif c ~= 'd' then
      back[#back + 1] = v
      event_add(K, 'released', nil, nil, group_of(v))
    end
  end
  to_head(K, back, false)
  chunked('rpush', K.dead_letter, nil, dead)
  if #back > 0 then
    -- Every process's consumers look again (items back at a list's head: nothing to transfer).
    wake_consumers(K, now_ms())
  end
  count = #items
end
handoff_forget(K, ARGV[1])
return count
