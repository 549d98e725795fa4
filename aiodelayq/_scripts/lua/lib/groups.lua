-- defines: GROUP_FLAG group_of group_list group_limit groups_arrive groups_hand_out group_settled to_head
-- uses: lib/chunked.lua lib/item.lua lib/reversed.lua
-- Ordered groups (docs/design.md, "Groups"). A grouped item's envelope is flagged GROUP_FLAG and
-- carries '>H' length | group after its schedule key (aiodelayq/_wire/elements.py). While pending it
-- waits in K.grouped (a zset by due ms that Redisson's transfer never reads); once due, its payload
-- waits in its group's list 'aiodelayq_group_<group>:{N}' (the group with '%' and '{' escaped, so
-- the hash tag stays the queue's), in order. K.groups maps each group with items waiting there to
-- their number, and '' (no group's name) to their total; K.group_flight maps a group to its
-- messages in flight (reliable consumers). K.group_turns lists the groups that may hand out one
-- more: items waiting and fewer than the group limit in flight. Consumers take one item of the
-- group at the head, which goes to the tail if it may hand out more: round robin, so a group with
-- many items waits its turn like one with a single item. A group is listed at most once, but a
-- stale entry (the limit was lowered) is harmless: every entry is checked when its turn comes.
local GROUP_FLAG = 4
local GROUP_ESCAPES = {['%'] = '%25', ['{'] = '%7B'}
-- The group of a payload, or nil (a bare payload, or an envelope without one).
local function group_of(payload)
  if string.byte(payload, 1) ~= ITEM_BYTE or string.len(payload) < 24 or string.sub(payload, 1, 5) ~= ITEM_MAGIC
      or string.byte(payload, 22) % 8 < GROUP_FLAG then
    return nil
  end
  local hlen, klen = struct.unpack('>I2>I2', payload, 14)
  local at = 23 + hlen + klen
  local glen = struct.unpack('>I2', payload, at)
  return string.sub(payload, at + 2, at + 1 + glen)
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
local function in_flight(K, g)
  return tonumber(redis.call('hget', K.group_flight, g)) or 0
end
-- `n` (negative: fewer) items more wait in the groups' lists: their total (field '', gone at 0).
local function waiting_total(K, n)
  if n ~= 0 and redis.call('hincrby', K.groups, '', n) <= 0 then redis.call('hdel', K.groups, '') end
end
-- Due grouped payloads (in due order) join the tails of their groups' lists; a group that had
-- nothing waiting and may hand out takes a turn. (One without a group, never written there by
-- aiodelayq, goes to the destination.)
local function groups_arrive(K, payloads)
  if #payloads == 0 then return end
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
  chunked('rpush', K.destination, nil, plain)
  local limit, turns = nil, {}
  for _, g in ipairs(order) do
    local list = by[g]
    chunked('rpush', group_list(K, g), nil, list)
    if redis.call('hincrby', K.groups, g, #list) == #list then
      limit = limit or group_limit(K)
      if in_flight(K, g) < limit then turns[#turns + 1] = g end
    end
  end
  waiting_total(K, #payloads - #plain)
  chunked('rpush', K.group_turns, nil, turns)
end
-- Up to `want` payloads, one per group in turn; `held`: for reliable consumers (each counts in its
-- group's flight until settled), else for take (nothing is counted; a group whose flight is full
-- waits for its reliable consumers all the same).
local function groups_hand_out(K, want, held)
  local out = {}
  local n = want >= 1 and redis.call('llen', K.group_turns) or 0
  if n == 0 then return out end
  local limit = group_limit(K)
  -- take reads a group's flight only while some group has messages in flight.
  local flying = held or redis.call('hlen', K.group_flight) > 0
  while #out < want and n > 0 do
    n = n - 1
    local g = redis.call('lpop', K.group_turns)
    if not g then break end
    local flight = 0
    if held and limit == 1 then  -- counted first, in one call: HSETNX sets 1 only where none is in flight
      flight = redis.call('hsetnx', K.group_flight, g, 1) == 1 and 1 or 2
    elseif held then  -- counted first; undone below if it had no room or nothing waits
      flight = redis.call('hincrby', K.group_flight, g, 1)
    elseif flying then
      flight = in_flight(K, g) + 1
    end
    local p = flight <= limit and redis.call('lpop', group_list(K, g)) or nil
    if not p and held and (limit > 1 or flight == 1) then
      if redis.call('hincrby', K.group_flight, g, -1) <= 0 then redis.call('hdel', K.group_flight, g) end
    end
    -- (no room: a stale turn; the group takes one again when a message of it settles)
    if p then
      out[#out + 1] = p
      if redis.call('hincrby', K.groups, g, -1) <= 0 then
        redis.call('hdel', K.groups, g)
      elseif flight < limit or not held then  -- (take: it handed out only with room, and holds none)
        redis.call('rpush', K.group_turns, g)
        n = n + 1
      end
    elseif flight <= limit then  -- its turn, but nothing waits (never left so by aiodelayq)
      redis.call('hdel', K.groups, g)
    end
  end
  waiting_total(K, -#out)
  return out
end
-- A message of group g left flight (acked, dead-lettered, expired). Returns true when the group
-- took a turn and it is the only one (consumers that found nothing should look again).
local function group_settled(K, g)
  local flight = redis.call('hincrby', K.group_flight, g, -1)
  if flight <= 0 then
    redis.call('hdel', K.group_flight, g)
    flight = 0
  end
  if flight == group_limit(K) - 1 and redis.call('hexists', K.groups, g) == 1 then
    return redis.call('rpush', K.group_turns, g) == 1
  end
  return false
end
-- Payloads nobody took go back to the head of where they came from, in order: the destination
-- for ungrouped ones, their group's list for grouped ones (whose turn comes first); `held`: they
-- were messages in flight (counted in their group's flight).
local function to_head(K, payloads, held)
  local plain, by, order = {}, {}, {}
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
  chunked('lpush', K.destination, nil, reversed(plain))
  if #order == 0 then return end
  local limit, total = group_limit(K), 0
  for _, g in ipairs(order) do
    local list = by[g]
    chunked('lpush', group_list(K, g), nil, reversed(list))
    total = total + #list
    local waiting = redis.call('hincrby', K.groups, g, #list)
    local flight = in_flight(K, g)
    local before = flight
    if held then
      flight = math.max(0, flight - #list)
      if flight > 0 then redis.call('hset', K.group_flight, g, flight) else redis.call('hdel', K.group_flight, g) end
    end
    -- It had no turn when nothing waited or its flight was full; now it has one, first.
    if flight < limit and (waiting == #list or before >= limit) then redis.call('lpush', K.group_turns, g) end
  end
  waiting_total(K, total)
end
