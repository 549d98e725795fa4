-- defines: parse is_fast LSZ FAST_HEADER FAST_MAGIC
-- Element kinds (the layouts, seen from Python, are in aiodelayq/_wire/elements.py):
-- - strict (Redisson >= 3.21.1, and strict=True): struct.pack('Bc0Lc0', 8, <8 random bytes>,
--   #payload, payload), in the timeout zset and in Redisson's insertion-order list;
-- - legacy (Redisson < 3.21.1, and wire_format="redisson-legacy"): struct.pack('dLc0', <random
--   double>, #payload, payload), zset and list;
-- - fast (aiodelayq's default): struct.pack('Bc0Lc0', 20, <id>, #payload, payload) with id =
--   'adq' 0x01 | 8-byte big-endian insertion stamp (us) | 8 random bytes, zset only. Redisson's own
--   unpack('Bc0Lc0') reads it like any other element.
-- parse accepts every kind and checks every length, so a legacy element is never read as a strict
-- one (or the reverse) and garbage is recognised as garbage. An element that satisfies both the
-- strict and the legacy layout needs a legacy double whose first byte is 0x08 and a one-byte payload
-- "\0"; it is read as strict. parse returns the payload (or nil), whether the element is a fast one
-- (kept out of the insertion-order list, so nothing has to be removed from that list when it moves),
-- and where its key tag would start (see lib/index.lua).
local LSZ = string.len(struct.pack('L', 0))
local FAST_MAGIC = 'adq' .. string.char(1)
-- The bytes of a fast element before its payload.
local FAST_HEADER = 21 + LSZ
-- Fast elements (the default, and disjoint from strict ones by their first byte) are tried first:
-- is_fast's test, inlined (parse runs once per moved element). The library functions are upvalues
-- (no global and field lookup per call), and # reads the length.
local byte_, sub_, unpack_ = string.byte, string.sub, struct.unpack
local M1, M2, M3, M4 = byte_(FAST_MAGIC, 1, 4)
local function parse(v)
  local n = #v
  local b0, b1, b2, b3, b4 = byte_(v, 1, 5)  -- (one call, no string made for the magic's compare)
  if b0 == 20 and n >= FAST_HEADER and b1 == M1 and b2 == M2 and b3 == M3 and b4 == M4
      and unpack_('L', v, 22) == n - FAST_HEADER then
    return sub_(v, FAST_HEADER + 1), true, 14
  end
  if b0 == 8 and n >= 9 + LSZ then
    local len = unpack_('L', v, 10)
    if len == n - 9 - LSZ then return sub_(v, 10 + LSZ), false, 2 end
  end
  if n >= 8 + LSZ then
    local len = unpack_('L', v, 9)
    if len == n - 8 - LSZ then return sub_(v, 9 + LSZ), false, 1 end
  end
  return nil, false, nil
end
-- Whether v is a fast element, checked as parse checks it, without making its payload (POP hands
-- such elements out whole: the client strips FAST_HEADER bytes).
local function is_fast(v)
  local n = #v
  local b0, b1, b2, b3, b4 = byte_(v, 1, 5)
  return b0 == 20 and n >= FAST_HEADER and b1 == M1 and b2 == M2 and b3 == M3 and b4 == M4
    and unpack_('L', v, 22) == n - FAST_HEADER
end
