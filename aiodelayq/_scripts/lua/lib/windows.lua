-- defines: windows_open windows_due windows_write windows_trim
-- uses: lib/chunked.lua
-- Deduplication windows (offer(..., dedupe_for=)): K.dedupe_windows scores each taken key by when
-- its window ends (server ms), K.dedupe_dues holds the due time of the item that took it. A window
-- is open while its end is after now. Ended ones stay until an offer trims them (windows_trim), so
-- reads count only the open ones.
-- The open windows of `names` (keys, each at most once): {key = end ms}, read 1000 per ZMSCORE,
-- and whether any key has a window; ({}, false) when none has, at the cost of one ZCARD.
local function windows_open(K, names, now)
  local open = {}
  if #names == 0 or redis.call('zcard', K.dedupe_windows) == 0 then return open, false end
  for c = 1, #names, 1000 do
    local last = math.min(c + 999, #names)
    local ends = redis.call('zmscore', K.dedupe_windows, unpack(names, c, last))
    for j = 1, last - c + 1 do
      local e = tonumber(ends[j])
      if e and e > now then open[names[c + j - 1]] = e end
    end
  end
  return open, true
end
-- The due time (text) of the item that took `key`'s open window.
local function windows_due(K, key)
  return redis.call('hget', K.dedupe_dues, key) or '0'
end
-- Open or move the windows of `taken` (a list of {key, end ms, due ms}, one per key).
local function windows_write(K, taken)
  local ends, dues = {}, {}
  for _, t in ipairs(taken) do
    ends[#ends + 1] = t[2]
    ends[#ends + 1] = t[1]
    dues[#dues + 1] = t[1]
    dues[#dues + 1] = string.format('%d', t[3])
  end
  chunked('zadd', K.dedupe_windows, nil, ends)
  chunked('hset', K.dedupe_dues, nil, dues)
end
-- Drop at most `most` ended windows, the earliest first: an offer's trim never holds the server.
local function windows_trim(K, now, most)
  local ended = redis.call('zrangebyscore', K.dedupe_windows, '-inf', now, 'LIMIT', 0, most)
  if #ended > 0 then
    redis.call('zrem', K.dedupe_windows, unpack(ended))
    redis.call('hdel', K.dedupe_dues, unpack(ended))
  end
end
