-- REMOVE_PAGE: one page of the walk that removes pending elements by payload, once per call id.
-- KEYS: timeout_set delay_list calls call_replies
-- KEYS[1] timeout zset, KEYS[2] delay list, KEYS[3] calls zset, KEYS[4] call replies hash
-- ARGV[1] call id (16 bytes, the same for a resend of this page), ARGV[2] cursor score ('' = from
-- the start), ARGV[3] cursor member, ARGV[4] page size, ARGV[5] '1': stop at the first match,
-- '0': every match; ARGV[6] '1' for a resend, '0' for the first attempt; ARGV[7..] payloads
-- returns: {removed, cursor score, cursor member}; the cursor is false, false when the walk is over
-- (with '1', a page that removed one ends the walk too).
-- Each match is ZREMed; a non-fast one (Redisson's, strict, legacy) is also LREMed from the delay
-- list: O(list), Redisson's cost. Removals come first, then the call is remembered: under
-- maxmemory only a script's first write is refused, and deletions are never refused.
-- The reply is remembered under the call id for the call window when the page removed something,
-- and always by a resend: a later run of the id (a resend, or the first attempt arriving late on a
-- dropped connection) answers as the remembered run did and removes nothing. A first attempt that
-- removed nothing only read and leaves no trace (a walk for an absent item writes nothing).
if first_run(KEYS[3], ARGV[1]) then
  local r = unpack_list(redis.call('hget', KEYS[4], ARGV[1]) or '')
  if #r == 3 then
    if r[2] == '' then return {tonumber(r[1]), false, false} end
    return {tonumber(r[1]), r[2], r[3]}
  end
end
local payloads = {}
for i = 7, #ARGV do payloads[#payloads + 1] = ARGV[i] end
local match = matcher(payloads)
local first_only = ARGV[5] == '1'
local hits, listed = {}, {}
local score, member = walk_page(KEYS[1], ARGV[2], ARGV[3], tonumber(ARGV[4]), function(v)
  local payload, fast = match(v)
  if payload == nil then return false end
  hits[#hits + 1] = v
  if not fast then listed[#listed + 1] = v end
  return first_only
end)
for _, v in ipairs(hits) do redis.call('zrem', KEYS[1], v) end
for _, v in ipairs(listed) do redis.call('lrem', KEYS[2], 1, v) end
if #hits > 0 or ARGV[6] == '1' then
  remember(KEYS[3], KEYS[4], ARGV[1], now_ms(), pack_list({tostring(#hits), score or '', member or ''}))
end
return {#hits, score or false, member or false}
