-- OFFER: add items to the pending zset (and Redisson's list), once per call id; publish a new earliest due time.
-- KEYS: destination timeout_set delay_list channel calls call_replies key_index controls tier_index tier_count schedules grouped groups dedupe_windows dedupe_dues event_stream
-- uses: lib/calls.lua lib/chunked.lua lib/clock.lua lib/events.lua lib/groups.lua lib/index.lua lib/issue.lua lib/item.lua lib/parse.lua lib/sweep.lua lib/tiers.lua lib/windows.lua
-- A 'shards' field in the controls hash: the name is a sharded queue's, refused (error reply
-- 'SHARDED <count>').
-- ARGV[1] call id (16 bytes), ARGV[2] when the client issued the call, server ms as the client
-- estimates it ('' = no estimate), ARGV[3] element kind ('grouped': fast elements, some of them
-- grouped items, which go to K.grouped instead: lib/groups.lua), ARGV[4] keys: '' for a call without
-- keys, else one letter per item, '-' (no key), 'n' (keep a pending item of its key) or 'r'
-- (replace it), 'N' or 'R' the same with a deduplication window, then the keys of the keyed items,
-- in order, each '>I2' length-prefixed, followed for 'N' and 'R' by the window's length (ms, '>d');
-- the element of a keyed item carries its key's tag. A key whose window is open (lib/windows.lua)
-- is not written unless its item is pending and replaced; an item written with a window opens its
-- key's (or moves it: it ends the window's length after now).
-- ARGV[5] capacity, the most items the queue may hold, pending (tiered included) + ready ('' for
-- no limit; grouped items count, pending and due), then how the call's items are refused: 'a' (all or nothing: a call whose new items do
-- not all fit writes nothing and returns {false, now, room}; one with the key of a recurring
-- schedule writes nothing and returns {false, now, 'scheduled', that key}) or 'e' (coalesced
-- offers, each item on its own: 'f' in the outcome when it does not fit, 's' when its key is a
-- schedule's). No letter: 'a'. Replacing a key's pending item takes no room; keeping it ('p') none
-- either.
-- ARGV[6..] by kind:
--   'fast':   elements packed by the client (with this server's 'L' size), all in one argument so
--             the client does not send thousands of arguments: ARGV[6] = concatenated
--             struct.pack('>dI4c0', delay ms, element), ARGV[7] = their count; zset only. Then,
--             for a producer with tier_after_s, ARGV[8] its horizon (ms) and ARGV[9] the width of
--             its buckets (ms, at most the horizon and 60,000): in a call without keys, an item
--             whose bucket (its due time rounded down to a multiple of the width) starts more than
--             the horizon after now is RPUSHed to that bucket instead (a new bucket enters the
--             tier index, scored by its start minus the width; the tier count grows).
--   'strict' (8-byte id) or 'legacy' (dLc0): ARGV[6..] triples of delay ms, id (strict: 8 bytes;
--             legacy: a decimal long, or for a keyed item the 8 bytes of the double), payload;
--             packed here; zset + list.
-- returns: {base, now, outcome, us}: each item is due at base + its delay. base is the issue time when
-- it is sane (not after now, at most MAX_ISSUE_AGE_MS before it), else now, the server time (ms)
-- of this run. outcome is '' for a call without keys and without an 'e' limit, else one letter per
-- item, 'a' added, 'r' replaced a pending item of its key, 'p' kept the pending item of its key
-- (nothing written), 'd' refused by its key's open window (nothing written), 'f' refused (the queue
-- was full), 's' refused (its key is a recurring schedule's), then for every 'p' and 'd' ',' and the
-- due ms of the pending item, or of the item that took the window. us: the µs this run took (the producer sizes its next calls by it). A resend of the same call
-- id within the window writes nothing and returns {base, false, outcome} of the first run (a call
-- refused whole wrote nothing and is not remembered).
-- Publishes the earliest new due time when it is earlier than the previous zset head, so every
-- transfer task re-arms (Redisson publishes when the new element becomes the head); likewise a new
-- bucket's promotion time earlier than both the zset head and the first bucket's; and a grouped
-- item's due time earlier than both zsets' heads.
local sharded = redis.call('hget', K.controls, 'shards')
if sharded then return redis.error_reply('SHARDED ' .. sharded) end
local first = first_run(K, ARGV[1])
if first then return {first, false, redis.call('hget', K.call_replies, ARGV[1]) or ''} end
local now, started = now_ms()
local base = issue_base(ARGV[2], now)
-- An item's expiry is its issue time (the client's estimate, ARGV[2]) + its delay + its lifetime; when
-- the call ran too long after its issue, its due times count from now instead, and so must its expiries
-- (an item lives its whole lifetime after its due time): they move by as much.
local moved_ms = tonumber(ARGV[2]) and base - math.floor(tonumber(ARGV[2])) or 0
local head = redis.call('zrange', K.timeout_set, 0, 0, 'WITHSCORES')
local old = head[2] and tonumber(head[2]) or nil
local kind = ARGV[3]
-- Whether the call has grouped items: each is checked (else none is, at no cost).
local grouping = kind == 'grouped'
if grouping then kind = 'fast' end
local grouped_head = nil  -- the earliest pending grouped item's due time (with grouping)
if grouping then
  local h = redis.call('zrange', K.grouped, 0, 0, 'WITHSCORES')[2]
  grouped_head = h and tonumber(h)
end
-- The group of a fast element of a grouped item (else nil).
local function group_in(v)
  return grouping and string.byte(v, FAST_HEADER + 1) == ITEM_BYTE and group_of(v, FAST_HEADER + 1) or nil
end
local function is_grouped(v) return group_in(v) ~= nil end
-- The events of the call (lib/events.lua: nothing while off), appended once it has decided every
-- item: {kind, key, element} each.
local noted = {}
local function note(what, key, v)
  if events_on(K) then noted[#noted + 1] = {what, key, v} end
end
local grouped_earliest = nil
local keys = ARGV[4] ~= '' and ARGV[4] or nil
-- The items this call may add under capacity (nil: no limit), and whether they are admitted one by one.
local room, each, cap = nil, string.sub(ARGV[5], -1) == 'e', string.match(ARGV[5], '^%d+')
if cap then
  room = tonumber(cap) - redis.call('zcard', K.timeout_set) - redis.call('llen', K.destination)
    - (tonumber(redis.call('get', K.tier_count)) or 0) - redis.call('zcard', K.grouped)
    - (tonumber(redis.call('hget', K.groups, '')) or 0)
end
local added = 0
local letters, kept = {}, {}
-- Whether the outcome has a letter per item: a call with keys, or one whose items are admitted one by one.
local spelled = keys ~= nil or (each and room ~= nil)
-- Admit one more new item under capacity: true ('a' in the outcome when it has letters), or
-- false when the queue is full ('f').
local function admit()
  if room ~= nil and added >= room then
    letters[#letters + 1] = 'f'
    return false
  end
  added = added + 1
  if spelled then letters[#letters + 1] = 'a' end
  return true
end
local earliest = nil
-- The tier's wake-up for this call's buckets: the earliest promotion time among them (nil: none).
local promotion = nil
-- The element of a strict or legacy item (fast ones come packed).
local function element(i, keyed)
  local id, payload = ARGV[i + 1], ARGV[i + 2]
  if moved_ms ~= 0 then payload = item_expiry_moved(payload, moved_ms) end
  if kind == 'legacy' and keyed then return id .. struct.pack('Lc0', string.len(payload), payload) end
  if kind == 'legacy' then return struct.pack('dLc0', tonumber(id), string.len(payload), payload) end
  return struct.pack('Bc0Lc0', string.len(id), id, string.len(payload), payload)
end
if not keys and kind == 'fast' then
  local blob, pos, n = ARGV[6], 1, tonumber(ARGV[7])
  if room and not each and n > room then return {false, now, room} end
  local zargs, gargs = {}, {}
  local after, width = tonumber(ARGV[8] or ''), tonumber(ARGV[9] or '')
  local buckets, starts, tiered = {}, {}, 0  -- bucket start -> its new entries; the starts in order
  for _ = 1, n do
    local d, v
    d, v, pos = struct.unpack('>dI4c0', blob, pos)
    if moved_ms ~= 0 then v = element_expiry_moved(v, moved_ms) end
    if admit() then
      note('offered', nil, v)
      local due = base + d
      local start = after and due - due % width
      if is_grouped(v) then
        gargs[#gargs + 1] = due
        gargs[#gargs + 1] = v
        if grouped_earliest == nil or due < grouped_earliest then grouped_earliest = due end
      elseif after and start - after > now then
        local entries = buckets[start]
        if not entries then
          entries = {}
          buckets[start] = entries
          starts[#starts + 1] = start
        end
        entries[#entries + 1] = struct.pack('>I2', due - start) .. v
        tiered = tiered + 1
      else
        zargs[#zargs + 1] = due
        zargs[#zargs + 1] = v
        if earliest == nil or due < earliest then earliest = due end
      end
    end
  end
  chunked('zadd', K.timeout_set, 'NX', zargs)
  chunked('zadd', K.grouped, 'NX', gargs)
  if tiered > 0 then
    local bucket_head = redis.call('zrange', K.tier_index, 0, 0, 'WITHSCORES')
    local listed = {}
    for _, start in ipairs(starts) do
      local name = string.format('%d', start)
      chunked('rpush', tier_bucket(K, name), nil, buckets[start])
      listed[#listed + 1] = start - width
      listed[#listed + 1] = name
      if promotion == nil or start - width < promotion then promotion = start - width end
    end
    chunked('zadd', K.tier_index, 'NX', listed)
    redis.call('incrby', K.tier_count, tiered)
    -- Only a promotion earlier than every bucket's is news to the transfer tasks.
    if bucket_head[2] and tonumber(bucket_head[2]) <= promotion then promotion = nil end
  end
elseif not keys then
  if room and not each and (#ARGV - 5) / 3 > room then return {false, now, room} end
  for i = 6, #ARGV, 3 do
    if admit() then
      local due, v = base + tonumber(ARGV[i]), element(i, false)
      if redis.call('zadd', K.timeout_set, 'NX', due, v) == 1 then
        note('offered', nil, v)
        redis.call('rpush', K.delay_list, v)
        if earliest == nil or due < earliest then earliest = due end
      end
    end
  end
else
  -- With keys: the items, then their index entries in one HMGET per 1000, then one decision per item
  -- in order against those entries as this call changes them (a key may come twice), then the
  -- writes in a few calls.
  local dues, values = {}, {}
  if kind == 'fast' then
    local blob, pos = ARGV[6], 1
    for i = 1, tonumber(ARGV[7]) do
      local d, v
      d, v, pos = struct.unpack('>dI4c0', blob, pos)
      dues[i], values[i] = base + d, moved_ms ~= 0 and element_expiry_moved(v, moved_ms) or v
    end
  else
    for i = 6, #ARGV, 3 do
      local n = (i - 3) / 3
      dues[n], values[n] = base + tonumber(ARGV[i]), element(i, string.byte(keys, n) ~= 45)
    end
  end
  local count = #values
  local cache, dirty, tags, names, asked = {}, {}, {}, {}, {}
  local replacing, lengths, distinct, seen = {}, {}, {}, {}  -- lengths: window ms by item
  local pos = count + 1
  for i = 1, count do
    local letter = string.byte(keys, i)
    if letter ~= 45 then  -- '-': no key
      local len = struct.unpack('>I2', keys, pos)
      names[i] = string.sub(keys, pos + 2, pos + 1 + len)
      pos = pos + 2 + len
      if letter == 78 or letter == 82 then  -- 'N', 'R'
        lengths[i] = struct.unpack('>d', keys, pos)
        pos = pos + 8
      end
      replacing[i] = letter == 114 or letter == 82  -- 'r', 'R'
      tags[i] = element_tag(values[i])
      asked[#asked + 1] = tags[i]
      if not seen[names[i]] then seen[names[i]] = true; distinct[#distinct + 1] = names[i] end
    end
  end
  -- The keys' open windows as this call leaves them (key -> end ms), and the ones it writes.
  local open, windowed = windows_open(K, distinct, now)
  local opened, taken = {}, {}
  for c = 1, #asked, 1000 do
    local last = math.min(c + 999, #asked)
    for j, blob in ipairs(redis.call('hmget', K.key_index, unpack(asked, c, last))) do
      if cache[asked[c + j - 1]] == nil then cache[asked[c + j - 1]] = index_pairs(blob) end
    end
  end
  -- The keys recurring schedules hold (the schedule's own item is their only item).
  local scheduled = {}
  if #asked > 0 and redis.call('hlen', K.schedules) > 0 then
    local keyed = {}
    for i = 1, count do
      if names[i] then keyed[#keyed + 1] = i end
    end
    for c = 1, #keyed, 1000 do
      local last = math.min(c + 999, #keyed)
      local asked_names = {}
      for j = c, last do asked_names[#asked_names + 1] = names[keyed[j]] end
      for j, rec in ipairs(redis.call('hmget', K.schedules, unpack(asked_names))) do
        if rec then scheduled[keyed[c + j - 1]] = true end
      end
    end
  end
  -- Replaced elements are removed after every decision: a call refused whole writes nothing.
  local adds, written, gone, removed = {}, {}, {}, {}
  local overflow, spilled = redis.call('hget', K.key_index, INDEX_OVERFLOW) ~= false, false
  -- The pair at an index field as this call left it ({} if none), read once.
  local function pair_at(field)
    if cache[field] == nil then cache[field] = index_pairs(redis.call('hget', K.key_index, field)) end
    return cache[field]
  end
  -- The score of an element as this call left it (nil: not pending).
  local function score_of(v)
    if written[v] then return written[v] end
    if gone[v] then return nil end
    return pending_score(K, v)
  end
  for i = 1, count do
    local v, due, key = values[i], dues[i], names[i]
    if not key then
      if admit() then
        adds[#adds + 1] = i
        note('offered', nil, v)
      elseif not each then
        return {false, now, room}
      end
    elseif scheduled[i] then
      if not each then return {false, now, 'scheduled', key} end
      letters[#letters + 1] = 's'
    else
      local field, spill = tags[i], nil
      local kv = cache[field]
      if kv[1] ~= key and overflow then
        spill = overflow_field(key)
        if pair_at(spill)[1] == key then field, kv = spill, cache[spill] end
      end
      local score = kv[1] == key and score_of(kv[2]) or nil
      if score and not replacing[i] then
        letters[#letters + 1] = 'p'
        kept[#kept + 1] = ',' .. score
        note('deduplicated', key, v)
      elseif not score and open[key] then
        letters[#letters + 1] = 'd'
        kept[#kept + 1] = ',' .. (opened[key] and string.format('%d', opened[key][3]) or windows_due(K, key))
        note('deduplicated', key, v)
      elseif not score and not admit() then
        if not each then return {false, now, room} end
      else
        if score then  -- (else admitted above)
          local replaced = kv[2]
          if not written[replaced] then removed[#removed + 1] = replaced end
          written[replaced], gone[replaced] = nil, true
          letters[#letters + 1] = 'r'
        end
        if kv[1] ~= key and kv[2] and score_of(kv[2]) then
          -- The tag belongs to another key with a pending element (a SHA-1 prefix collision).
          field = spill or overflow_field(key)
          overflow, spilled = true, true
        end
        if field ~= tags[i] and string.byte(v, 1) == 20 then  -- no transfer may drop the tag's field
          v = string.sub(v, 1, 13) .. string.char(string.byte(v, 14) % 128) .. string.sub(v, 15)
          values[i] = v
        end
        cache[field] = {key, v}
        if not dirty[field] then dirty[field] = true; dirty[#dirty + 1] = field end
        adds[#adds + 1] = i
        note('offered', key, v)
        written[v] = due
        if lengths[i] then
          open[key] = now + lengths[i]
          if not opened[key] then opened[key] = {key}; taken[#taken + 1] = opened[key] end
          opened[key][2], opened[key][3] = open[key], due
        end
      end
    end
  end
  for _, replaced in ipairs(removed) do
    if redis.call('zrem', K.timeout_set, replaced) == 0 then redis.call('zrem', K.grouped, replaced) end
    local _, fast = parse(replaced)
    if not fast then redis.call('lrem', K.delay_list, 1, replaced) end
  end
  local zargs, gargs, listed, hargs = {}, {}, {}, {}
  for _, i in ipairs(adds) do
    local v, due = values[i], dues[i]
    if not gone[v] then
      if is_grouped(v) then
        gargs[#gargs + 1] = due
        gargs[#gargs + 1] = v
        if grouped_earliest == nil or due < grouped_earliest then grouped_earliest = due end
      else
        zargs[#zargs + 1] = due
        zargs[#zargs + 1] = v
        if kind ~= 'fast' then listed[#listed + 1] = v end
        if earliest == nil or due < earliest then earliest = due end
      end
    end
  end
  for _, field in ipairs(dirty) do
    hargs[#hargs + 1] = field
    hargs[#hargs + 1] = index_pair(cache[field][1], cache[field][2])
  end
  if spilled then
    hargs[#hargs + 1] = INDEX_OVERFLOW
    hargs[#hargs + 1] = '1'
  end
  chunked('zadd', K.timeout_set, 'NX', zargs)
  chunked('zadd', K.grouped, 'NX', gargs)
  chunked('rpush', K.delay_list, nil, listed)
  chunked('hset', K.key_index, nil, hargs)
  if #taken > 0 then windows_write(K, taken) end
  -- Trim ended windows: at least as many as this call opened, so trimming keeps up with offers.
  if windowed or #taken > 0 then
    windows_trim(K, now, 100 + 2 * #taken)
  end
end
if promotion ~= nil and (earliest == nil or promotion < earliest) then earliest = promotion end
if earliest ~= nil and (old == nil or earliest < old) then
  if grouped_earliest ~= nil and grouped_earliest < earliest then earliest = grouped_earliest end
  redis.call('publish', K.channel, string.format('%d', earliest))
elseif grouped_earliest ~= nil and (old == nil or grouped_earliest < old)
    and (grouped_head == nil or grouped_earliest < grouped_head) then
  redis.call('publish', K.channel, string.format('%d', grouped_earliest))
end
for _, e in ipairs(noted) do event_add(K, e[1], e[2], nil, group_in(e[3])) end
local outcome = table.concat(letters) .. table.concat(kept)
if keys then sweep_index(K, 2) end
-- Remembered by base (at most MAX_ISSUE_AGE_MS before now): a resend returns it.
remember(K, ARGV[1], base, outcome ~= '' and outcome or nil)
return {base, now, outcome, elapsed_us(started)}
