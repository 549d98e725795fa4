-- POP: pop ready items into the leased hand-off under a call id, transferring first if asked.
-- KEYS: destination handoff handoff_leases timeout_set delay_list dead_letter key_index controls channel schedules tier_index tier_count grouped groups group_ready event_stream
-- uses: lib/clock.lua lib/controls.lua lib/events.lua lib/groups.lua lib/hand_out.lua lib/handoff.lua lib/item.lua lib/parse.lua lib/transfer.lua
-- ARGV[1] call id (16 bytes), ARGV[2] at most this many items, ARGV[3] lease ms, ARGV[4] transfer
-- first, at most |ARGV[4]| elements (0: no transfer; negative: with the moved items' lateness, as
-- TRANSFER's negative ARGV[1]); the moved items it pops skip the list when the list was empty (the
-- keys end the same, one hop less), ARGV[5] '1': a backlog drain's top-up instead: pop the list
-- first, then move just the items still wanted (|ARGV[4]| per move, more while the call is young),
-- which skip the list;
-- unless a hand-off lease ended (its items go first: as for '0'), ARGV[6..] call ids of earlier
-- pops whose every item was handed out: forgotten here (FINISH with an all-'d' plan, without its
-- round trip; idempotent)
-- returns: {transfer reply (see TRANSFER: its 7 fields, the destination's length after the pop,
-- and for a negative ARGV[4] the lateness list) or false, hold, expired, bare, header, {popped
-- items, head first}}: the first `bare` items are payloads; the rest are fast elements handed out
-- whole (moved by this pop, each with a bare payload after `header` bytes: the caller strips them),
-- so the script never makes their payloads. expired: how many popped items had an envelope whose
-- expiry had passed: those went to the dead-letter list (reason expired) instead, and fewer than
-- asked are returned. Handing out an occurrence of a recurring item schedules its next occurrence
-- (lib/hand_out.lua).
-- Grouped items (lib/groups.lua) come from the groups' ready list, each taken admitting its group's
-- next; while the ready list has some, it gets half of what is asked (for one item: every other
-- millisecond), and either list gives what the other leaves. Their order in the reply is not their
-- due order across groups.
-- hold: 0, or -1 when the queue is paused (nothing popped), or the ms until the rate limit lets
-- one more item out (fewer than asked popped, perhaps none). The transfer runs either way. They
-- are recorded in the hand-off under the call id (lib/handoff.lua) until FINISH (or a later POP)
-- says what became of them; if neither comes (the process died, or was cut off), TRANSFER returns
-- them to the head of the destination once the lease ends.
-- A resend of the same call id returns the same items (or none, after a FINISH '*' that overtook
-- it), without transferring again.
local TOP_UP_US = 1500
-- Two moves' replies as one (TRANSFER's fields, and the lateness lists): counts added, TIME from the
-- first, the outlook (next wake-up, earliest lease) from the second.
local function merged(a, a_late, b, b_late)
  if not a then return b, b_late end
  if a_late then for _, v in ipairs(b_late) do a_late[#a_late + 1] = v end end
  return {a[1] + b[1], a[2] + b[2], b[3], a[4], a[5], a[6] + b[6], b[7]}, a_late
end
for i = 6, #ARGV do handoff_forget(K, ARGV[i]) end
local got = redis.call('hget', K.handoff, ARGV[1])
if got then
  local items = handoff_items(got)
  return {false, 0, 0, #items, 0, items}
end
local want, hold, level, now = controls_allow(K, tonumber(ARGV[2]))
local asked = want
want = want - groups_share(K, want, now)
local limit = tonumber(ARGV[4])
local moved, late, items, bare = false, nil, nil, 0
if limit ~= 0 and ARGV[5] == '1' and want > 0
    and #redis.call('zrangebyscore', K.handoff_leases, '-inf', now_ms(), 'LIMIT', 0, 1) == 0 then
  items = redis.call('lpop', K.destination, want) or {}
  bare = #items
  -- The list is empty now: what it moves for the pop skips it. One move is at most |limit| elements
  -- (the transfer's bound on a call's work); another follows while the call is under TOP_UP_US, so a
  -- zset of millions, several times dearer per element, holds the server no longer than TRANSFER.
  local need = want - #items
  while need > 0 do
    local step = math.min(need, math.abs(limit))
    local m, l, kept, whole = transfer(K, limit < 0 and -step or step, step)
    moved, late = merged(moved, late, m, l)
    if not kept then break end  -- (a hand-off lease ended: the moved items wait in the list)
    local n = #items
    if not whole then
      for i = bare + 1, n do items[i] = (parse(items[i])) end  -- payloads after elements: all payloads
      bare = n + #kept
    end
    if n == 0 then items = kept else for i = 1, #kept do items[n + i] = kept[i] end end
    need = need - #kept
    if #kept < step or elapsed_us({moved[4], moved[5]}) >= TOP_UP_US then break end
  end
else
  if limit ~= 0 then
    -- What it moves and pops at once skips the list when the list was empty (lib/transfer.lua).
    local whole
    moved, late, items, whole = transfer(K, limit, want)
    bare = items and not whole and #items or 0
  end
  if not items and want > 0 then
    items = redis.call('lpop', K.destination, want)
    bare = items and #items or 0
  end
end
if asked > (items and #items or 0) then
  -- The groups' share, and what the destination gave short of its own (lib/groups.lua).
  items = items or {}
  local grouped = groups_hand_out(K, asked - #items, false)
  local more = want < asked and #items + #grouped < asked
    and redis.call('lpop', K.destination, asked - #items - #grouped) or {}
  if #grouped + #more > 0 then
    for i = bare + 1, #items do items[i] = (parse(items[i])) end  -- payloads after elements: all payloads
    for _, p in ipairs(grouped) do items[#items + 1] = p end
    for _, p in ipairs(more) do items[#items + 1] = p end
    bare = #items
  end
  if #items == 0 then items = nil end
end
local out = {moved, hold, 0, 0, FAST_HEADER, {}}
if items then
  now = now or now_ms()
  local n, kept, byte_ = #items, items, string.byte
  for i = 1, bare do  -- most often only bare payloads: handed out as they are, without a copy
    if byte_(items[i], 1) == ITEM_BYTE then
      kept = nil
      break
    end
  end
  if not kept then
    local k, was = 0, bare
    kept, bare = {}, 0
    for i = 1, n do
      local v = items[i]
      if i <= was and byte_(v, 1) == ITEM_BYTE then v = hand_out(K, v, 0, now) end
      if v then
        k = k + 1
        kept[k] = v
        if i <= was then bare = k end
      end
    end
  end
  out[3], out[4], out[6] = n - #kept, bare, kept
  controls_charge(K, now, level, #kept)
  if #kept > 0 and events_on(K) then
    for i, v in ipairs(kept) do
      event_add(K, 'delivered', nil, nil, group_of(i <= bare and v or (parse(v))), 1)
    end
  end
  if #kept > 0 then
    redis.call('hset', K.handoff, ARGV[1], handoff_entry(kept, bare))
    redis.call('zadd', K.handoff_leases, now + tonumber(ARGV[3]), ARGV[1])
  end
end
if moved then
  moved[#moved + 1] = redis.call('llen', K.destination) + redis.call('llen', K.group_ready)
  if late then moved[#moved + 1] = late end
end
return out
