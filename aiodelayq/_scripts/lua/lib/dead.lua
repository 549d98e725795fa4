-- defines: dead_entry DEAD_MAGIC DEAD_MAX_DELIVERIES DEAD_UNDECODABLE DEAD_MALFORMED DEAD_NACKED DEAD_EXPIRED
-- Dead-letter entries (layout in aiodelayq/_wire/elements.py): 'adq' 0x03 (the envelope, version 1) |
-- '>B' reason | '>I4' delivery count | '>d' server ms when it died | the raw bytes (the payload, or
-- the malformed element as found).
local DEAD_MAGIC = 'adq' .. string.char(3)
local DEAD_MAX_DELIVERIES, DEAD_UNDECODABLE, DEAD_MALFORMED, DEAD_NACKED, DEAD_EXPIRED = 1, 2, 3, 4, 5
local function dead_entry(reason, count, now, raw)
  return DEAD_MAGIC .. struct.pack('>B>I4>d', reason, count, now) .. raw
end
