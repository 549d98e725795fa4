-- defines: chunked
-- redis.call(cmd, key, [flag,] values...) in chunks of 1000 values (Lua's unpack has a stack
-- limit); 1000 is even, so ZADD's score/member pairs stay together. Returns the last call's reply
-- (nil without values): for RPUSH and LPUSH, the list's length after them all.
local function chunked(cmd, key, flag, values)
  local reply
  for i = 1, #values, 1000 do
    local last = math.min(i + 999, #values)
    if flag then
      reply = redis.call(cmd, key, flag, unpack(values, i, last))
    else
      reply = redis.call(cmd, key, unpack(values, i, last))
    end
  end
  return reply
end
