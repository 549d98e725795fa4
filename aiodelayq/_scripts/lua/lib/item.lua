-- defines: ITEM_MAGIC item_expired item_without_expiry
-- Item envelopes (layout in aiodelayq/_wire/envelope.py): 0xC1 'adq' 0x04 | '>d' expiry (server ms,
-- 0 = none) | '>H' headers length | headers | payload. A bare payload never starts with 0xC1 the
-- way an envelope does, so a plain item costs one byte compare here.
local ITEM_MAGIC = string.char(193) .. 'adq' .. string.char(4)
-- Whether payload is an envelope whose expiry is at or before now (server ms).
local function item_expired(payload, now)
  if string.byte(payload, 1) ~= 193 or string.len(payload) < 15 or string.sub(payload, 1, 5) ~= ITEM_MAGIC then
    return false
  end
  local at = struct.unpack('>d', payload, 6)
  return at > 0 and at <= now
end
-- payload without its expiry (a requeued dead letter is delivered whatever its expiry was).
local function item_without_expiry(payload)
  if string.byte(payload, 1) ~= 193 or string.len(payload) < 15 or string.sub(payload, 1, 5) ~= ITEM_MAGIC then
    return payload
  end
  return ITEM_MAGIC .. struct.pack('>d', 0) .. string.sub(payload, 14)
end
