-- defines: ITEM_BYTE ITEM_MAGIC item_expired item_without_expiry item_expiry_moved element_expiry_moved item_schedule item_with_occurrence item_flagged
-- uses: lib/parse.lua
-- Item envelopes (layout in aiodelayq/_wire/elements.py): 0xC1 'adq' 0x04 | '>d' expiry (server ms,
-- 0 = none) | '>H' headers length | '>H' schedule key length | '>I4' occurrence number | '>B' flags
-- (1: its consumer should list more cron times; 2: a resync, not an item: its consumer lists
-- more cron times and delivers nothing) | headers | schedule key | payload. A bare payload never
-- starts with ITEM_BYTE (0xC1) the way an envelope does, so callers test string.byte(payload, 1) ==
-- ITEM_BYTE before calling these.
local ITEM_BYTE = 193
local ITEM_MAGIC = string.char(ITEM_BYTE) .. 'adq' .. string.char(4)
local function is_item(payload)
  return string.len(payload) >= 22 and string.sub(payload, 1, 5) == ITEM_MAGIC
end
-- Whether payload is an envelope whose expiry is at or before now (server ms).
local function item_expired(payload, now)
  if not is_item(payload) then return false end
  local at = struct.unpack('>d', payload, 6)
  return at > 0 and at <= now
end
-- payload without its expiry (a requeued dead letter is delivered whatever its expiry was).
local function item_without_expiry(payload)
  if string.byte(payload, 1) ~= ITEM_BYTE or not is_item(payload) then return payload end
  return ITEM_MAGIC .. struct.pack('>d', 0) .. string.sub(payload, 14)
end
-- payload with its expiry moved by `ms` (a bare payload, or an envelope without expiry: as it is).
local function item_expiry_moved(payload, ms)
  if string.byte(payload, 1) ~= ITEM_BYTE or not is_item(payload) then return payload end
  local at = struct.unpack('>d', payload, 6)
  if at == 0 then return payload end
  return ITEM_MAGIC .. struct.pack('>d', at + ms) .. string.sub(payload, 14)
end
-- A fast element `v` (lib/parse.lua) with its payload's expiry moved by `ms`: the payload's length
-- does not change, so neither does the element's header.
local function element_expiry_moved(v, ms)
  local at = 22 + LSZ
  if string.byte(v, at) ~= ITEM_BYTE then return v end
  return string.sub(v, 1, at - 1) .. item_expiry_moved(string.sub(v, at), ms)
end
-- The schedule key and occurrence number of an occurrence of a recurring item (nil: not one).
local function item_schedule(payload)
  if not is_item(payload) then return nil end
  local hlen, klen, seq = struct.unpack('>I2>I2>I4', payload, 14)
  if klen == 0 then return nil end
  return string.sub(payload, 23 + hlen, 22 + hlen + klen), seq
end
-- payload (an occurrence) with its occurrence number set to seq and its flags to `flags`.
local function item_with_occurrence(payload, seq, flags)
  return string.sub(payload, 1, 17) .. struct.pack('>I4B', seq, flags or 0) .. string.sub(payload, 23)
end
-- payload (an occurrence) flagged: its consumer lists more cron times.
local function item_flagged(payload)
  return string.sub(payload, 1, 21) .. string.char(bit.bor(string.byte(payload, 22), 1)) .. string.sub(payload, 23)
end
