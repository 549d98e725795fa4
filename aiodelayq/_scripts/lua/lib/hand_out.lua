-- defines: hand_out
-- uses: lib/dead.lua lib/events.lua lib/groups.lua lib/item.lua lib/recur.lua
-- hand_out(K, payload, count, now): what becomes of `payload` handed out at `now` (server ms) by POP
-- or RECEIVE after `count` deliveries (0: never delivered). An item envelope whose expiry has passed
-- goes to the dead-letter list (reason expired, with `count`): nil. Else the payload to hand out: an
-- occurrence of a recurring item schedules the next one (recur_next: once, so a redelivery
-- continues nothing, unless its schedule stalled: its first consumer did not list more cron times),
-- flagged when its consumer should list more; any other payload as it is. Callers skip the call for
-- a payload whose first byte is not ITEM_BYTE (a bare one: most of them), so a bare payload costs
-- POP and RECEIVE no function call.
local NO_EXPIRY = string.rep('\0', 8)
local function hand_out(K, payload, count, now)
  -- An envelope without expiry and schedule key (headers, a group): nothing to do, read in two compares.
  if string.sub(payload, 6, 13) == NO_EXPIRY and string.byte(payload, 16) == 0 and string.byte(payload, 17) == 0 then
    return payload
  end
  if item_expired(payload, now) then
    redis.call('rpush', K.dead_letter, dead_entry(DEAD_EXPIRED, count, now, payload))
    if events_on(K) then event_add(K, 'expired', nil, nil, group_of(payload), count, DEAD_EXPIRED) end
    return nil
  end
  if recur_next(K, payload, now) then return item_flagged(payload) end
  return payload
end
