-- defines: reversed
-- 'lpush' of a reversed list puts the values at the head in their original order.
local function reversed(values)
  local out = {}
  for i = #values, 1, -1 do out[#out + 1] = values[i] end
  return out
end
