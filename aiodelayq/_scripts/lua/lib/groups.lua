-- defines: GROUP_FLAG GROUPS_HASH_TABLE group_of group_list group_limit groups_share groups_arrive groups_hand_out group_settled message_settled to_head
-- uses: lib/chunked.lua lib/clock.lua lib/item.lua lib/reversed.lua
-- Ordered groups (docs/controls.md, "Groups and limits"). A grouped item's envelope is flagged
-- GROUP_FLAG and carries '>H' length | group after its schedule key (aiodelayq/_wire/elements.py).
-- While pending it waits in K.grouped (a zset by due ms that Redisson's transfer never reads); once
-- due, its payload waits in its group's list 'aiodelayq_group_<group>:{N}' (the group with '%' and
-- '{' escaped, so the hash tag stays the queue's), in order. K.groups holds a field per group with
-- items waiting there or messages in flight (reliable consumers), valued its messages in flight (0
-- while only waiting), and '' (no group's name) holding how many items wait in all the lists.
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
-- message element's), or nil (a bare payload, or an envelope without one); nothing is copied.
local function group_of(s, at)
  at = at or 1
  if string.byte(s, at) ~= ITEM_BYTE or string.len(s) < at + 23 or string.sub(s, at, at + 4) ~= ITEM_MAGIC
      or string.byte(s, at + 21) % 8 < GROUP_FLAG then
    return nil
  end
  local hlen, klen = struct.unpack('>I2>I2', s, at + 13)
  local start = at + 22 + hlen + klen
  local glen = struct.unpack('>I2', s, start)
  return string.sub(s, start + 2, start + 1 + glen)
end
-- The list of a group's due items (made once per group in a call).
local LIST_NAMES = {}
local function group_list(K, g)
  local name = LIST_NAMES[g]
  if not name then
    name = 'aiodelayq_group_' .. (string.gsub(g, '[%%{]', GROUP_ESCAPES)) .. string.sub(K.groups, 17)
    LIST_NAMES[g] = name
  end
  return name
end
-- How many messages of one group may be in flight at once (set_group_concurrency; default 1), read
-- once per call.
local GROUP_LIMIT = nil
local function group_limit(K)
  GROUP_LIMIT = GROUP_LIMIT or tonumber(redis.call('hget', K.controls, 'group_limit')) or 1
  return GROUP_LIMIT
end
local function flight_of(K, g)
  return tonumber(redis.call('hget', K.groups, g)) or 0
end
-- Before a group's field is added: the hash is a hash table (see above).
local function groups_hash(K)
  redis.call('hsetnx', K.groups, GROUPS_HASH_TABLE, 1)
end
-- Drop a field of K.groups; the hash goes with the last but GROUPS_HASH_TABLE.
local function groups_drop(K, field)
  redis.call('hdel', K.groups, field)
  if redis.call('hlen', K.groups) == 1 and redis.call('hexists', K.groups, GROUPS_HASH_TABLE) == 1 then
    redis.call('unlink', K.groups)
  end
end
-- `n` (negative: fewer) items more wait in the groups' lists: their total (field '', gone at 0).
local function waiting_total(K, n)
  if n ~= 0 and redis.call('hincrby', K.groups, '', n) <= 0 then groups_drop(K, '') end
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
-- aiodelayq, goes to the destination.)
local function groups_arrive(K, payloads)
  if #payloads == 0 then return end
  local by, order, plain = by_group(payloads)
  chunked('rpush', K.destination, nil, plain)
  local limit, turns = group_limit(K), {}
  if #order > 0 then groups_hash(K) end
  for _, g in ipairs(order) do
    local list = by[g]
    local length = chunked('rpush', group_list(K, g), nil, list)
    -- Nothing waited: a turn if it has room (a new field: none in flight).
    if length == #list and (redis.call('hsetnx', K.groups, g, 0) == 1 or flight_of(K, g) < limit) then
      turns[#turns + 1] = g
    end
  end
  waiting_total(K, #payloads - #plain)
  chunked('rpush', K.group_turns, nil, turns)
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
-- waits for its reliable consumers all the same).
local function groups_hand_out(K, want, held)
  local out = {}
  local n = want >= 1 and redis.call('llen', K.group_turns) or 0
  if n == 0 then return out end
  local limit = group_limit(K)
  while #out < want and n > 0 do
    n = n - 1
    local g = redis.call('lpop', K.group_turns)
    if not g then break end
    local list = group_list(K, g)
    -- Counted first (as if, for take): taken back below when it had no room or nothing waits.
    local flight = held and redis.call('hincrby', K.groups, g, 1) or flight_of(K, g) + 1
    local p = flight <= limit and redis.call('lpop', list) or nil
    if p then
      out[#out + 1] = p
      if flight < limit or not held then  -- room for more: its turn again while items wait
        if redis.call('llen', list) > 0 then
          redis.call('rpush', K.group_turns, g)
          n = n + 1
        elseif flight == 1 and not held then  -- (take: nothing waits, nothing in flight)
          groups_drop(K, g)
        end
      end
    else  -- a stale turn, or nothing waits (never left so by aiodelayq)
      flight = held and redis.call('hincrby', K.groups, g, -1) or flight - 1
      if flight <= 0 and redis.call('llen', list) == 0 then groups_drop(K, g) end
    end
  end
  waiting_total(K, -#out)
  return out
end
-- A message of group g left flight (acked, dead-lettered, expired). Returns true when the group
-- took a turn and it is the only one (consumers that found nothing should look again).
local function group_settled(K, g)
  local flight = redis.call('hincrby', K.groups, g, -1)
  if flight < 0 then  -- (not counted: a grouped payload that came another way)
    flight = 0
    redis.call('hset', K.groups, g, 0)
  end
  local limit = group_limit(K)
  if flight >= limit then return false end  -- still full (the limit was lowered)
  if redis.call('llen', group_list(K, g)) == 0 then
    if flight == 0 then groups_drop(K, g) end
    return false
  end
  return flight == limit - 1 and redis.call('rpush', K.group_turns, g) == 1
end
-- The payload at byte `at` of `s` (33: a message element's) left flight for good: group_settled for
-- its group, if it has one; whether that gave the groups their only turn.
local function message_settled(K, s, at)
  local g = string.byte(s, at) == ITEM_BYTE and group_of(s, at)
  return g and group_settled(K, g) or false
end
-- Payloads nobody took go back to the head of where they came from, in order: the destination
-- for ungrouped ones, their group's list for grouped ones (whose turn comes first); `held`: they
-- were messages in flight (counted in their group's flight).
local function to_head(K, payloads, held)
  local by, order, plain = by_group(payloads)
  chunked('lpush', K.destination, nil, reversed(plain))
  if #order == 0 then return end
  groups_hash(K)
  local limit, total = group_limit(K), 0
  for _, g in ipairs(order) do
    local list = by[g]
    local length = chunked('lpush', group_list(K, g), nil, reversed(list))
    total = total + #list
    local flight, before
    if held then
      flight = redis.call('hincrby', K.groups, g, -#list)
      if flight < 0 then
        flight = 0
        redis.call('hset', K.groups, g, 0)
      end
      before = flight + #list
    else
      flight = redis.call('hsetnx', K.groups, g, 0) == 1 and 0 or flight_of(K, g)
      before = flight
    end
    -- It had no turn when nothing waited or its flight was full; now it has one, first.
    if flight < limit and (length == #list or before >= limit) then redis.call('lpush', K.group_turns, g) end
  end
  waiting_total(K, total)
end
