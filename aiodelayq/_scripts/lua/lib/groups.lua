-- defines: GROUP_FLAG GROUPS_HASH_TABLE group_of group_list group_limit group_field groups_write groups_share groups_arrive groups_hand_out groups_admit message_settled groups_settle to_head
-- uses: lib/chunked.lua lib/clock.lua lib/item.lua lib/reversed.lua
-- Ordered groups (docs/controls.md, "Groups and limits"). A grouped item's envelope is flagged
-- GROUP_FLAG and carries '>H' length | group after its schedule key (aiodelayq/_wire/elements.py).
-- While pending it waits in K.grouped (a zset by due ms that Redisson's transfer never reads). Once
-- due, a group's items are admitted in order, up to the group limit at once: an admitted item waits
-- in K.group_ready (one list for every group, in order of admission), then is a message in flight
-- (reliable consumers) until it is settled; the others wait in their group's list
-- 'aiodelayq_group_<group>:{N}' (the group with '%' and '{' escaped, so the hash tag stays the
-- queue's). Consumers pop K.group_ready as they pop the destination, with no work per group: a
-- settle admits the group's next item at the ready list's tail, so groups take turns in the order
-- their messages settle, and a group with many items waits its turn like one with a single item.
-- A take (at most once, nothing in flight) admits the next one as it takes one.
-- A group's items wait in its list only while it has the limit's worth admitted: every call that
-- settles a group's message, gives it back or raises the limit admits its next items while there is
-- room. K.groups holds a field per group with items admitted, valued admitted + WAITING_FLAG when
-- its list may hold items (group_field, groups_write): set as an item joins the list, cleared by the
-- first admission that finds the list short. So a settle that admits the group's next item in its
-- place writes nothing, and a group without the flag costs no list command. A call reads its groups'
-- fields in one HMGET and writes the changed ones in one HSET. '' (no group's name) holds how many
-- items wait in the ready list and the groups' lists together. A lowered limit takes back nothing
-- admitted: it holds from the next admission. While K.groups exists it also holds the field
-- GROUPS_HASH_TABLE, longer than any group (at most 256 bytes) and than a listpack's values: so
-- Redis keeps the hash a hash table, where a group's field is found in O(1), not in a scan of up to
-- 512 fields (a listpack).
local GROUP_FLAG = 4
-- (300 '#' written out: string.rep would build it again on every call)
local GROUPS_HASH_TABLE = '############################################################################################################################################################################################################################################################################################################'
local GROUP_ESCAPES = {['%'] = '%25', ['{'] = '%7B'}
-- The group of the payload that starts at byte `at` of `s` (default 1: `s` is the payload; 33: a
-- message element's), or nil (a bare payload, or an envelope without one). It runs per grouped
-- message in SETTLE: it reads bytes, not struct formats, and only the group is copied.
local byte_, sub_, find_ = string.byte, string.sub, string.find
local function group_of(s, at)
  at = at or 1
  if sub_(s, at, at + 4) ~= ITEM_MAGIC then return nil end
  local flags, h1, h2, k1, k2 = byte_(s, at + 21), byte_(s, at + 13, at + 16)
  if not flags or flags % 8 < GROUP_FLAG then return nil end
  local start = at + 22 + h1 * 256 + h2 + k1 * 256 + k2
  local l1, l2 = byte_(s, start, start + 1)
  return l2 and sub_(s, start + 2, start + 1 + l1 * 256 + l2) or nil
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
-- A group's items admitted (ready or in flight), whether its list may hold items, and the value, from
-- its field's value (nil or false: no field, neither).
local WAITING_FLAG = 1048576  -- 2^20, above any admitted count (the group limit is at most 1,000,000)
local function group_field(value)
  value = tonumber(value) or 0
  if value >= WAITING_FLAG then return value - WAITING_FLAG, true, value end
  return value, false, value
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
-- Drop fields of K.groups; the hash goes with the last but GROUPS_HASH_TABLE.
local function groups_drop(K, fields)
  if #fields == 0 then return end
  chunked('hdel', K.groups, nil, fields)
  if redis.call('hlen', K.groups) == 1 and redis.call('hexists', K.groups, GROUPS_HASH_TABLE) == 1 then
    redis.call('unlink', K.groups)
  end
end
-- Write the fields of `groups` (the i-th: admits[i] admitted, waits[i] its list may hold items)
-- whose value differs from before[i] (no `before`: all), in one HSET per 500; a group with neither
-- has no field (dropped). (Arrays by position, not tables by group: they run per group per call.)
local function groups_write(K, groups, admits, waits, before)
  local set, gone = {}, {}
  for i, g in ipairs(groups) do
    local value = admits[i] + (waits[i] and WAITING_FLAG or 0)
    if value == 0 then
      gone[#gone + 1] = g
    elseif not before or before[i] ~= value then
      set[#set + 1], set[#set + 2] = g, value
    end
  end
  if #set > 0 then
    redis.call('hsetnx', K.groups, GROUPS_HASH_TABLE, 1)  -- (before a group's field: see above)
    chunked('hset', K.groups, nil, set)
  end
  groups_drop(K, gone)
end
-- `n` (negative: fewer) items more wait in the ready list and the groups' lists: their total (field
-- '', gone at 0).
local function waiting_total(K, n)
  if n ~= 0 and redis.call('hincrby', K.groups, '', n) <= 0 then groups_drop(K, {''}) end
end
-- `payloads` by group: {group -> its payloads in order}, the groups in order of first payload, the
-- payloads without a group, and those with one (in order).
local function by_group(payloads)
  local by, order, plain, grouped = {}, {}, {}, {}
  for _, p in ipairs(payloads) do
    local g = group_of(p)
    if g then
      local list = by[g]
      if not list then
        list = {}
        by[g], order[#order + 1] = list, g
      end
      list[#list + 1] = p
      grouped[#grouped + 1] = p
    else
      plain[#plain + 1] = p
    end
  end
  return by, order, plain, grouped
end
-- Admit the next items of `groups` (the i-th: admits[i] admitted, waits[i] its list may hold items:
-- updated) while under `limit`: they leave their group's list for the ready list's tail; a list
-- found short clears the group's flag. Returns true when the ready list was empty before (consumers
-- that found nothing should look again).
local function groups_admit(K, groups, admits, waits, limit)
  local ready = {}
  for i, g in ipairs(groups) do
    local n = waits[i] and limit - admits[i] or 0
    if n == 1 then  -- (most often: one settled, one admitted; a payload, not an array of one)
      local p = redis.call('lpop', group_list(K, g))
      if p then
        ready[#ready + 1], admits[i] = p, admits[i] + 1
      else
        waits[i] = false
      end
    elseif n > 0 then
      local got = redis.call('lpop', group_list(K, g), n) or {}
      for j = 1, #got do ready[#ready + 1] = got[j] end
      admits[i], waits[i] = admits[i] + #got, #got == n
    end
  end
  return #ready > 0 and chunked('rpush', K.group_ready, nil, ready) == #ready
end
-- Items of `left` (a group per item, repeated for each) left their groups for good: each group's
-- admitted count goes down by its items and its next items are admitted (the fields read in one
-- HMGET; a group whose value is unchanged, one admitted in place of each that left, is not
-- written). Returns groups_admit's answer.
local function groups_leave(K, left)
  local at, order, counts = {}, {}, {}
  for _, g in ipairs(left) do
    local i = at[g]
    if i then
      counts[i] = counts[i] + 1
    else
      i = #order + 1
      at[g], order[i], counts[i] = i, g, 1
    end
  end
  local admits, waits, before = {}, {}, {}
  for i, f in ipairs(groups_fields(K, order)) do
    local admitted, waiting, value = group_field(f)  -- (no field: a grouped payload that came another way)
    admits[i], waits[i], before[i] = math.max(0, admitted - counts[i]), waiting, value
  end
  local admitted = groups_admit(K, order, admits, waits, group_limit(K))
  groups_write(K, order, admits, waits, before)
  return admitted
end
-- Due grouped payloads (in due order) join their groups: admitted at the ready list's tail while
-- the group is under its limit with nothing waiting, else at the tail of its list. (One without a
-- group, never written there by aiodelayq, goes to the destination.) The groups' fields are read in
-- one HMGET and written in one HSET.
local function groups_arrive(K, payloads)
  if #payloads == 0 then return end
  local by, order, plain = by_group(payloads)
  chunked('rpush', K.destination, nil, plain)
  if #order > 0 then
    local limit, fields, ready, admits, waits, before = group_limit(K), groups_fields(K, order), {}, {}, {}, {}
    for i, g in ipairs(order) do
      local list, admitted, waiting, value = by[g], group_field(fields[i])
      -- (under the limit, its list is empty: see above)
      local n = waiting and 0 or math.max(0, math.min(limit - admitted, #list))
      local rest = list
      if n > 0 then
        rest = {}
        for j = 1, n do ready[#ready + 1] = list[j] end
        for j = n + 1, #list do rest[j - n] = list[j] end
      end
      chunked('rpush', group_list(K, g), nil, rest)  -- (none: no call)
      admits[i], waits[i], before[i] = admitted + n, waiting or #rest > 0, value
    end
    chunked('rpush', K.group_ready, nil, ready)
    groups_write(K, order, admits, waits, before)
  end
  waiting_total(K, #payloads - #plain)
end
-- How many of `want` fresh items a POP or RECEIVE takes from the ready list first: while it has
-- some, half (for one item: every other millisecond of `now`, read here when nil), else none;
-- either source then takes what the other leaves.
local function groups_share(K, want, now)
  if want < 1 or redis.call('llen', K.group_ready) == 0 then return 0 end
  return want >= 2 and math.floor(want / 2) or (now or now_ms()) % 2
end
-- Up to `want` admitted payloads, from the ready list's head. `held`: for reliable consumers, each
-- stays admitted (counted in its group) until settled: one LPOP. Else for take: each leaves its
-- group, whose next item is admitted at the tail, so a take goes on through a group's items in
-- turn with the others'.
local function groups_hand_out(K, want, held)
  if held then  -- (one LPOP: its reply is the answer)
    local out = redis.call('lpop', K.group_ready, want) or {}
    waiting_total(K, -#out)
    return out
  end
  local out = {}
  while #out < want do
    local got = redis.call('lpop', K.group_ready, want - #out)
    if not got then break end
    for j = 1, #got do out[#out + 1] = got[j] end
    local left = {}
    for _, p in ipairs(got) do
      local g = group_of(p)
      if g then left[#left + 1] = g end  -- (none: never so by aiodelayq)
    end
    groups_leave(K, left)
  end
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
-- Apply what message_settled collected (groups_leave). Returns true when the ready list was empty
-- before (consumers that found nothing should look again).
local function groups_settle(K)
  if #SETTLED == 0 then return false end
  local left = SETTLED
  SETTLED = {}
  return groups_leave(K, left)
end
-- Payloads nobody took go back to the head of where they came from, in order: the destination
-- for ungrouped ones, the ready list for grouped ones. `held`: they were messages in flight (still
-- admitted). Else they left their groups when taken, and each group's items admitted since then,
-- if that puts it over the limit, go back to the head of its list (at most the ready list's length
-- read: a rare path, a pop whose reply was lost or whose consumer died).
local function to_head(K, payloads, held)
  local by, order, plain, back = by_group(payloads)
  chunked('lpush', K.destination, nil, reversed(plain))
  if #order == 0 then return end
  chunked('lpush', K.group_ready, nil, reversed(back))
  waiting_total(K, #back)
  if held then return end
  local limit, fields, admits, waits, over = group_limit(K), groups_fields(K, order), {}, {}, {}
  for i, g in ipairs(order) do
    local admitted, waiting = group_field(fields[i])
    admits[i], waits[i] = admitted + #by[g], waiting
    if admits[i] > limit then over[g] = i end
  end
  if next(over) then
    -- The youngest admitted items of those groups (nearest the tail) go back to their lists' heads.
    local ready = redis.call('lrange', K.group_ready, #back, -1)
    for r = #ready, 1, -1 do
      local g = group_of(ready[r])
      local i = g and over[g]
      if i and admits[i] > limit then
        admits[i], waits[i] = admits[i] - 1, true
        redis.call('lrem', K.group_ready, -1, ready[r])
        redis.call('lpush', group_list(K, g), ready[r])
      end
    end
  end
  groups_write(K, order, admits, waits)
end
