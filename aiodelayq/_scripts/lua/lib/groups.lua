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
-- The list of a group's due items.
local function group_list(K, g)
  return 'aiodelayq_group_' .. (string.gsub(g, '[%%{]', GROUP_ESCAPES)) .. string.sub(K.groups, 17)
end
-- How many messages of one group may be in flight at once (set_group_concurrency; default 1).
local function group_limit(K)
  return tonumber(redis.call('hget', K.controls, 'group_limit')) or 1
end
local function in_flight(K, g)
  return tonumber(redis.call('hget', K.group_flight, g)) or 0
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
  if #plain < #payloads then redis.call('hincrby', K.groups, '', #payloads - #plain) end
  chunked('rpush', K.group_turns, nil, turns)
end
-- Up to `want` payloads, one per group in turn; `held`: for reliable consumers (each counts in its
-- group's flight until settled), else for take (nothing is counted; a group whose flight is full
-- waits for its reliable consumers all the same).
local function groups_hand_out(K, want, held)
  local out = {}
  if want < 1 or redis.call('llen', K.group_turns) == 0 then return out end
  local limit = group_limit(K)
  local n = redis.call('llen', K.group_turns)
  while #out < want and n > 0 do
    n = n - 1
    local g = redis.call('lpop', K.group_turns)
    if not g then break end
    local flight = in_flight(K, g)
    if flight < limit then  -- (else a stale turn: the group takes one again when a message settles)
      local p = redis.call('lpop', group_list(K, g))
      local left = 0
      if p then
        out[#out + 1] = p
        left = redis.call('hincrby', K.groups, g, -1)
        if held then
          redis.call('hincrby', K.group_flight, g, 1)
          flight = flight + 1
        end
      end
      if left <= 0 then
        redis.call('hdel', K.groups, g)
      elseif flight < limit then
        redis.call('rpush', K.group_turns, g)
        n = n + 1
      end
    end
  end
  if #out > 0 then redis.call('hincrby', K.groups, '', -#out) end
  return out
end
-- A message of group g left flight (acked, dead-lettered, expired). Returns true when the group
-- took a turn again (consumers should look).
local function group_settled(K, g)
  local flight = redis.call('hincrby', K.group_flight, g, -1)
  if flight <= 0 then
    redis.call('hdel', K.group_flight, g)
    flight = 0
  end
  if flight == group_limit(K) - 1 and redis.call('hexists', K.groups, g) == 1 then
    redis.call('rpush', K.group_turns, g)
    return true
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
  redis.call('hincrby', K.groups, '', total)
end
