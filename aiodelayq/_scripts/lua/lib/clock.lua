-- defines: now_ms elapsed_us
-- The server clock in epoch ms, and the raw TIME reply.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000), t
end
-- Server µs since the raw TIME reply t0 (a script's own run time).
local function elapsed_us(t0)
  local t = redis.call('TIME')
  return (tonumber(t[1]) - tonumber(t0[1])) * 1000000 + tonumber(t[2]) - tonumber(t0[2])
end
