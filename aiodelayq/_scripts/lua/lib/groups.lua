-- defines: GROUP_FLAG GROUPS_HASH_TABLE group_of group_list group_limit group_field groups_share groups_arrive groups_hand_out message_settled groups_settle to_head
-- uses: lib/chunked.lua lib/clock.lua lib/item.lua lib/reversed.lua
-- Ordered groups (docs/controls.md, "Groups and limits"). A grouped item's envelope is flagged
-- GROUP_FLAG and carries '>H' length | group after its schedule key (aiodelayq/_wire/elements.py).
-- While pending it waits in K.grouped (a zset by due ms that Redisson's transfer never reads); once
-- due, its payload waits in its group's list 'aiodelayq_group_<group>:{N}' (the group with '%' and
-- '{' escaped, so the hash tag stays the queue's), in order. K.groups holds a field per group with
-- items waiting there or messages in flight (reliable consumers), valued waiting * FLIGHT_SPAN + in
-- flight (group_field, groups_write): a call reads and writes a group's counts in its HMGET and
-- HSET, and never asks its list's length. '' (no group's name) holds how many items wait in all the lists.
-- K.group_turns lists the groups that may hand out one more: items waiting and fewer than the group
-- limit in flight. Consumers take one item of the group at the head, which goes to the tail if it
-- may hand out more: round robin, so a group with many items waits its turn like one with a single
-- item. A group is listed at most once, but a stale entry (the limit was lowered) is harmless: every
-- entry is checked when its turn comes. A group with nothing waiting and nothing in flight has no
-- field, no list and no turn. While K.groups exists it also holds the field GROUPS_HASH_TABLE, longer
-- than any group (at most 256 bytes) and than a listpack's values: so Redis keeps the hash a hash
-- table, where a group's field is found in O(1), not in a scan of up to 512 fields (a listpack).
local GROUP_FLAG = 4
local GROUPS_HASH_TABLE = string.rep('#', 300)
local GROUP_ESCAPES = {['%'] = '%25', ['{'] = '%7B'}
-- The group of the payload that starts at byte `at` of `s` (default 1: `s` is the payload; 33: a
-- message element's), or nil (a bare payload, or an envelope without one). It runs per grouped
-- message in RECEIVE and SETTLE: its magic is compared by bytes, and only the group is copied.
local byte_, sub_, unpack_, find_ = string.byte, string.sub, struct.unpack, string.find
local M0, M1, M2, M3, M4 = string.byte(ITEM_MAGIC, 1, 5)
local function group_of(s, at)
  at = at or 1
  local b0, b1, b2, b3, b4 = byte_(s, at, at + 4)
  if b0 ~= M0 or b1 ~= M1 or b2 ~= M2 or b3 ~= M3 or b4 ~= M4 then return nil end
  local flags = byte_(s, at + 21)
  if not flags or flags % 8 < GROUP_FLAG or string.len(s) < at + 23 then return nil end
  local hlen, klen = unpack_('>I2>I2', s, at + 13)
  local start = at + 22 + hlen + klen
  return sub_(s, start + 2, start + 1 + unpack_('>I2', s, start))
end
-- The list of a group's due items (made once per group in a call; most groups need no escape).
local LIST_NAMES, LIST_TAG = {}, nil
local function group_list(K, g)
  local name = LIST_NAMES[g]
  if not name then
    LIST_TAG = LIST_TAG or sub_(K.groups, 17)
    local escaped = (find_(g, '%', 1, true) or find_(g, '{', 1, true)) and (string.gsub(g, '[%%{]', GROUP_ESCAPES)) or g
    name = 'aiodelayq_group_' .. escaped .. LIST_TAG
    LIST_NAMES[g] = name
  end
  return name
end
-- How many messages of one group may be in flight at once (set_group_concurrency; default 1, at
-- most 1,000,000), read once per call.
local GROUP_LIMIT = nil
local function group_limit(K)
  GROUP_LIMIT = GROUP_LIMIT or tonumber(redis.call('hget', K.controls, 'group_limit')) or 1
  return GROUP_LIMIT
end
-- A group's messages in flight and items waiting, from its field's value (nil or false: no field,
-- none of either).
local FLIGHT_SPAN = 1048576  -- 2^20, above any flight (the group limit is at most 1,000,000)
local function group_field(value)
  value = tonumber(value) or 0
  local flight = value % FLIGHT_SPAN
  return flight, (value - flight) / FLIGHT_SPAN
end
-- The fields `fields` of K.groups (false where missing), 1000 per HMGET.
local function groups_fields(K, fields)
  local values = {}
  for i = 1, #fields, 1000 do
    local got = redis.call('hmget', K.groups, unpack(fields, i, math.min(i + 999, #fields)))
    for j = 1, #got do values[i + j - 1] = got[j] end
  end
  return values
end
-- Before a group's field is added: the hash is a hash table (see above).
local function groups_hash(K)
  redis.call('hsetnx', K.groups, GROUPS_HASH_TABLE, 1)
end
-- Drop fields of K.groups; the hash goes with the last but GROUPS_HASH_TABLE.
local function groups_drop(K, fields)
  if #fields == 0 then return end
  chunked('hdel', K.groups, nil, fields)
  if redis.call('hlen', K.groups) == 1 and redis.call('hexists', K.groups, GROUPS_HASH_TABLE) == 1 then
    redis.call('unlink', K.groups)
  end
end
-- Write the counts of `groups` (flights[g] in flight, waits[g] waiting) to their fields, in one HSET
-- per 500; a group with neither has no field (dropped). The values are text: HSET would write a
-- large number in exponent form.
local function groups_write(K, groups, flights, waits)
  local set, gone = {}, {}
  for _, g in ipairs(groups) do
    local flight, waiting = flights[g], waits[g]
    if flight == 0 and waiting == 0 then
      gone[#gone + 1] = g
    else
      set[#set + 1], set[#set + 2] = g, string.format('%d', waiting * FLIGHT_SPAN + flight)
    end
  end
  if #set > 0 then
    groups_hash(K)
    chunked('hset', K.groups, nil, set)
  end
  groups_drop(K, gone)
end
-- `n` (negative: fewer) items more wait in the groups' lists: their total (field '', gone at 0).
local function waiting_total(K, n)
  if n ~= 0 and redis.call('hincrby', K.groups, '', n) <= 0 then groups_drop(K, {''}) end
end
-- `payloads` by group: {group -> its payloads in order}, the groups in order of first payload, and
-- the payloads without a group.
local function by_group(payloads)
  local by, order, plain = {}, {}, {}
  for _, p in ipairs(payloads) do
    local g = group_of(p)
    if g then
      local list = by[g]
      if not list then
        list = {}
        by[g], order[#order + 1] = list, g
      end
      list[#list + 1] = p
    else
      plain[#plain + 1] = p
    end
  end
  return by, order, plain
end
-- Due grouped payloads (in due order) join the tails of their groups' lists; a group that had
-- nothing waiting and may hand out takes a turn. (One without a group, never written there by
-- aiodelayq, goes to the destination.) The groups' fields are read in one HMGET and written in one
-- HSET: a group costs its list's RPUSH.
local function groups_arrive(K, payloads)
  if #payloads == 0 then return end
  local by, order, plain = by_group(payloads)
  chunked('rpush', K.destination, nil, plain)
  if #order > 0 then
    local limit, fields, turns, flights, waits = group_limit(K), groups_fields(K, order), {}, {}, {}
    for i, g in ipairs(order) do
      local list, flight, waiting = by[g], group_field(fields[i])
      chunked('rpush', group_list(K, g), nil, list)
      if waiting == 0 and flight < limit then turns[#turns + 1] = g end  -- nothing waited: a turn if room
      flights[g], waits[g] = flight, waiting + #list
    end
    groups_write(K, order, flights, waits)
    chunked('rpush', K.group_turns, nil, turns)
  end
  waiting_total(K, #payloads - #plain)
end
-- How many of `want` fresh items a POP or RECEIVE takes from the groups first: while groups have
-- turns, half (for one item: every other millisecond of `now`, read here when nil), else none;
-- either source then takes what the other leaves.
local function groups_share(K, want, now)
  if want < 1 or redis.call('llen', K.group_turns) == 0 then return 0 end
  return want >= 2 and math.floor(want / 2) or (now or now_ms()) % 2
end
-- Up to `want` payloads, one per group in turn; `held`: for reliable consumers (each counts in its
-- group's flight until settled), else for take (nothing is counted; a group whose flight is full
-- waits for its reliable consumers all the same). The turns are taken in batches (one LPOP), their
-- fields read in one HMGET and written back in one HSET: a message costs its list's LPOP.
local function groups_hand_out(K, want, held)
  local out = {}
  if want < 1 then return out end
  local limit, flights, waits, changed = group_limit(K), {}, {}, {}  -- changed: {group -> true}
  while #out < want do
    local turns = redis.call('lpop', K.group_turns, want - #out)
    if not turns then break end
    local unread = {}
    for _, g in ipairs(turns) do
      if not flights[g] then
        flights[g] = 0
        unread[#unread + 1] = g
      end
    end
    for i, f in ipairs(groups_fields(K, unread)) do flights[unread[i]], waits[unread[i]] = group_field(f) end
    local again = {}
    for _, g in ipairs(turns) do
      local flight, waiting = flights[g], waits[g]
      local p = false  -- (a stale turn: nothing waits, or the flight is full since the limit was lowered)
      if flight < limit and waiting > 0 then
        p = redis.call('lpop', group_list(K, g))
        if not p then waits[g], changed[g] = 0, true end  -- its list is empty after all (never so by aiodelayq)
      end
      if p then
        out[#out + 1] = p
        waiting = waiting - 1
        if held then flight = flight + 1 end
        flights[g], waits[g], changed[g] = flight, waiting, true
        -- Room for more: its turn again while items wait.
        if waiting > 0 and (flight < limit or not held) then again[#again + 1] = g end
      end
    end
    chunked('rpush', K.group_turns, nil, again)
  end
  local written = {}
  for g in pairs(changed) do written[#written + 1] = g end
  groups_write(K, written, flights, waits)  -- (take: a group with nothing left goes)
  waiting_total(K, -#out)
  return out
end
-- The groups of the messages that left flight in this call, one entry per message, until
-- groups_settle applies them.
local SETTLED = {}
-- The payload at byte `at` of `s` (33: a message element's) left flight for good (acked,
-- dead-lettered, expired): its group, if it has one, is settled by the next groups_settle.
local function message_settled(s, at)
  local g = string.byte(s, at) == ITEM_BYTE and group_of(s, at)
  if g then SETTLED[#SETTLED + 1] = g end
end
-- Apply what message_settled collected: each group's flight goes down by its messages (their
-- fields read in one HMGET and written in one HSET); a group with room and items waiting takes a
-- turn if it had none (its flight was full), one with neither goes. Returns true when that gave
-- the groups their only turns (consumers that found nothing should look again).
local function groups_settle(K)
  if #SETTLED == 0 then return false end
  local left, order = {}, {}
  for _, g in ipairs(SETTLED) do
    if not left[g] then order[#order + 1] = g end
    left[g] = (left[g] or 0) + 1
  end
  SETTLED = {}
  local limit, flights, waits, turns = group_limit(K), {}, {}, {}
  for i, f in ipairs(groups_fields(K, order)) do
    local g = order[i]
    local before, waiting = group_field(f)  -- (no field: a grouped payload that came another way)
    local flight = math.max(0, before - left[g])
    flights[g], waits[g] = flight, waiting
    -- It was full: no turn until now.
    if waiting > 0 and flight < limit and before >= limit then turns[#turns + 1] = g end
  end
  groups_write(K, order, flights, waits)  -- (a group with nothing waiting and nothing in flight goes)
  return #turns > 0 and chunked('rpush', K.group_turns, nil, turns) == #turns
end
-- Payloads nobody took go back to the head of where they came from, in order: the destination
-- for ungrouped ones, their group's list for grouped ones (whose turn comes first); `held`: they
-- were messages in flight (counted in their group's flight).
local function to_head(K, payloads, held)
  local by, order, plain = by_group(payloads)
  chunked('lpush', K.destination, nil, reversed(plain))
  if #order == 0 then return end
  local limit, fields, flights, waits, total = group_limit(K), groups_fields(K, order), {}, {}, 0
  for i, g in ipairs(order) do
    local list, before, waiting = by[g], group_field(fields[i])
    chunked('lpush', group_list(K, g), nil, reversed(list))
    total = total + #list
    local flight = held and math.max(0, before - #list) or before
    -- It had no turn when nothing waited or its flight was full; now it has one, first.
    if flight < limit and (waiting == 0 or before >= limit) then redis.call('lpush', K.group_turns, g) end
    flights[g], waits[g] = flight, waiting + #list
  end
  groups_write(K, order, flights, waits)
  waiting_total(K, total)
end
