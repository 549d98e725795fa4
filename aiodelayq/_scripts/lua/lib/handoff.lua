-- defines: handoff_entry handoff_items handoff_forget
-- uses: lib/lists.lua lib/parse.lua
-- A hand-off entry: what POP handed out under one call id (see pop.lua). pack_list of the items; when
-- the last of them are fast elements handed out whole (a top-up's: lib/transfer.lua), byte 255, then
-- '>I4' how many come first as payloads, then pack_list. A plain entry never starts with byte 255 (a
-- first length of 4 GB); '' is a tombstone (finish.lua).
local function handoff_entry(items, bare)
  if bare >= #items then return pack_list(items) end
  return pack_list(items, '\255' .. struct.pack('>I4', bare))
end
-- The payloads of a hand-off entry, in order.
local function handoff_items(blob)
  if string.byte(blob, 1) ~= 255 then return unpack_list(blob) end
  local items = unpack_list(string.sub(blob, 6))
  for i = struct.unpack('>I4', blob, 2) + 1, #items do items[i] = (parse(items[i])) end
  return items
end
-- Forget the entry of call id `id` and its lease (idempotent).
local function handoff_forget(K, id)
  redis.call('hdel', K.handoff, id)
  redis.call('zrem', K.handoff_leases, id)
end
