-- defines: now_ms
-- The server clock in epoch ms, and the raw TIME reply.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000), t
end
