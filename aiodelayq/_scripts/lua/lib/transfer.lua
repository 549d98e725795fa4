-- defines: transfer
-- uses: lib/chunked.lua lib/clock.lua lib/dead.lua lib/events.lua lib/groups.lua lib/handoff.lua lib/item.lua lib/parse.lua lib/tiers.lua lib/unindex.lua
-- transfer(K, limit: at most |limit| elements; negative: also measure the lateness of what moves,
--          keep: up to this many of the moved payloads are returned instead of pushed, when they
--          would be the destination's first: POP's, which would pop them at once),
--          K: the destination, timeout_set, delay_list, dead_letter, handoff, handoff_leases,
--          key_index, tier_index, tier_count, controls, grouped, groups and group_ready keys
-- returns: {moved, dead_lettered, next wake-up (epoch ms, text: the zset's head score or the first
--           tier bucket's promotion time, whichever is earlier) or false, TIME seconds,
--           TIME micros, recovered, earliest hand-off lease deadline (ms, text) or false},
--          and, only for a negative limit, a second value: {lateness ms of each moved item, in
--          the order they were pushed}: now (whole ms of TIME) minus its due score, an integer >= 0
--          (the client adds TIME's sub-millisecond part). Only a metrics sink asks for it: it costs
--          WITHSCORES and a table; a positive limit runs exactly as before it existed. A third
--          value: the kept items in due order, when the destination was empty and no hand-off
--          lease had ended (nothing goes before them), else nil: the keys end as if they were pushed
--          and popped. A fourth: whether the kept are whole fast elements, each with a bare payload
--          after FAST_HEADER bytes (so each payload is never made here), else they are payloads.
-- The tier (lib/tiers.lua): |limit| entries of work in all, promoted or moved. First the buckets
-- whose start has come (a promotion fallen behind: their entries may be due), then the due
-- elements, then, with what is left, the buckets whose promotion time has come; a next wake-up at
-- or before TIME's ms says more is left to do at once.
-- Moves due elements (score <= now, server clock) in due order: the payload goes to the
-- destination; an element that is not a valid packed element goes, as it was, to the dead-letter
-- list (reason malformed), so one bad element can never stall the queue. Only elements that are in the insertion-
-- order list (strict, legacy, malformed ones) are LREMed from it: O(list) each. Fast elements cost
-- O(log N). The index entries of keyed elements that moved are dropped (their keys are free).
-- With the room left (at least a quarter of |limit|), due grouped items (K.grouped: lib/groups.lua) join their groups (admitted or waiting), the
-- same way (counted as moved). Then hand-off entries whose lease ran out (their consumer died, or was cut off longer than the
-- lease) go back to the head of the destination, in their order: "recovered".
-- Up to `room` due grouped elements join their groups (lib/groups.lua); returns how many moved and
-- how many were dead-lettered (malformed), and with `late` appends each moved one's lateness to it.
local function groups_transfer(K, now, room, late)
  if room < 1 then return 0, 0 end
  local scored = redis.call('zrangebyscore', K.grouped, '-inf', now, 'WITHSCORES', 'LIMIT', 0, room)
  if #scored == 0 then return 0, 0 end
  local payloads, owned, bad = {}, {}, {}
  for i = 1, #scored, 2 do
    local v = scored[i]
    local payload, fast = parse(v)
    if payload and fast then
      payloads[#payloads + 1] = payload
      if late then late[#late + 1] = now - scored[i + 1] end
      if string.byte(v, 14) >= 128 then owned[#owned + 1] = string.sub(v, 14, 21) end
    else
      bad[#bad + 1] = dead_entry(DEAD_MALFORMED, 0, now, v)
      event_add(K, 'dead_lettered', nil, nil, nil, 0, DEAD_MALFORMED)
    end
  end
  groups_arrive(K, payloads)
  chunked('rpush', K.dead_letter, nil, bad)
  redis.call('zremrangebyrank', K.grouped, 0, #scored / 2 - 1)
  unindex(K, owned, {}, {})
  return #payloads, #bad
end
local function transfer(K, limit, keep)
  local now, t = now_ms()
  local due, late
  -- A bucket still holding entries after its start: nothing due at or after its start moves yet.
  local promoted, left = promote(K, now, math.abs(limit), true)
  local room = math.abs(limit) - promoted
  local upto = left and '(' .. string.format('%d', left) or now
  if room == 0 then
    due = {}
    if limit < 0 then late = {} end
  elseif limit < 0 then
    -- Asked for lateness: the due scores too (member, score, ...), split into the members (the rest
    -- of the function is unchanged) and each one's lateness.
    local scored = redis.call('zrangebyscore', K.timeout_set, '-inf', upto, 'WITHSCORES', 'LIMIT', 0, room)
    due, late = {}, {}
    local m = 0
    for i = 1, #scored, 2 do
      m = m + 1
      due[m] = scored[i]
      late[m] = now - scored[i + 1]  -- Lua turns the score's text into a number (no tonumber lookup)
    end
  else
    due = redis.call('zrangebyscore', K.timeout_set, '-inf', upto, 'LIMIT', 0, room)
  end
  if #due < room then promote(K, now, room - #due, false) end
  local ended = redis.call('zrangebyscore', K.handoff_leases, '-inf', now, 'LIMIT', 0, 100)
  local out, bad, listed, owned, checked, starts = {}, {}, {}, {}, {}, {}
  local kept, whole  -- (see keep): the kept items, and whether they are whole fast elements
  if keep and keep > 0 and #due > 0 and #ended == 0 and redis.call('llen', K.destination) == 0 then
    kept, whole = {}, true
  end
  -- #out, #owned and #kept, counted: this loop is per moved element.
  local n, k, nk, byte_, sub_ = 0, 0, 0, string.byte, string.sub
  for i = 1, #due do
    local v = due[i]
    local taken = false
    if kept and nk < keep then
      -- A fast element with a bare payload is kept whole: its payload is never made here.
      if whole and is_fast(v) and byte_(v, FAST_HEADER + 1) ~= ITEM_BYTE then
        nk = nk + 1
        kept[nk] = v
        taken = true
        if byte_(v, 14) >= 128 then k = k + 1; owned[k] = sub_(v, 14, 21) end
      elseif whole then  -- another kind, or an envelope: the kept become payloads (rare)
        for j = 1, nk do kept[j] = (parse(kept[j])) end
        whole = false
      end
    end
    if not taken then
      local payload, fast, start = parse(v)
      if payload then
        if kept and nk < keep then
          nk = nk + 1
          kept[nk] = payload
        else
          n = n + 1
          out[n] = payload
        end
        if fast then
          -- A keyed fast element (tag bit set) owns its index field: unindex drops it unread.
          if byte_(v, 14) >= 128 then k = k + 1; owned[k] = sub_(v, 14, 21) end
        else
          checked[#checked + 1] = v
          starts[#starts + 1] = start
        end
      else
        bad[#bad + 1] = dead_entry(DEAD_MALFORMED, 0, now, v)
        event_add(K, 'dead_lettered', nil, nil, nil, 0, DEAD_MALFORMED)
        if late then late[i] = false end  -- dead-lettered, not moved: dropped from the lateness below
      end
      if not fast then listed[#listed + 1] = v end
    end
  end
  if kept and nk == 0 then kept, whole = nil, nil end
  -- Pushes first: under maxmemory the server refuses a script's *first* write, so nothing may be
  -- removed before the items are safely in the destination (a script error does not roll back).
  -- Kept items are safe in POP's hand-off entry, written after the removals below (writes, so
  -- the server no longer refuses it).
  chunked('rpush', K.destination, nil, out)
  chunked('rpush', K.dead_letter, nil, bad)
  for _, v in ipairs(listed) do redis.call('lrem', K.delay_list, 1, v) end
  -- The due elements are the zset's first #due (read from -inf, LIMIT 0): removed by rank, without
  -- ZREM's lookup per member, unless a promotion ranked an element among them since.
  if #due > 0 and redis.call('zrank', K.timeout_set, due[#due]) == #due - 1 then
    redis.call('zremrangebyrank', K.timeout_set, 0, #due - 1)
  else
    chunked('zrem', K.timeout_set, nil, due)
  end
  unindex(K, owned, checked, starts)
  if late and #bad > 0 then
    local shown = {}
    for j = 1, #due do if late[j] then shown[#shown + 1] = late[j] end end
    late = shown
  end
  -- Grouped items get what is left, and at least a quarter of the budget: a backlog of ungrouped
  -- items does not hold them back.
  local room_left = math.max(math.abs(limit) - promoted - #due, math.floor(math.abs(limit) / 4))
  local grouped_moved, grouped_bad = groups_transfer(K, now, room_left, late)
  local recovered = 0
  for _, id in ipairs(ended) do
    local blob = redis.call('hget', K.handoff, id)
    if blob and blob ~= '' then
      local items = handoff_items(blob)
      to_head(K, items, false)
      recovered = recovered + #items
    end
    redis.call('hdel', K.handoff, id)
    redis.call('zrem', K.handoff_leases, id)
  end
  local nxt = tier_next(K)
  local grouped_head = redis.call('zrange', K.grouped, 0, 0, 'WITHSCORES')[2]
  if grouped_head and (not nxt or tonumber(grouped_head) < tonumber(nxt)) then nxt = grouped_head end
  local lease = redis.call('zrange', K.handoff_leases, 0, 0, 'WITHSCORES')
  return {n + nk + grouped_moved, #bad + grouped_bad, nxt, t[1], t[2], recovered, lease[2] or false}, late, kept, whole
end
