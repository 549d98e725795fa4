-- RESCHEDULE: move the pending element of a key to a new due time, once per call id.
-- KEYS: timeout_set delay_list key_index channel calls call_replies grouped controls event_stream
-- uses: lib/calls.lua lib/clock.lua lib/events.lua lib/groups.lua lib/index.lua lib/issue.lua lib/parse.lua
-- ARGV[1] call id, ARGV[2] key, ARGV[3] its tag, ARGV[4] issue time (server ms as the client
-- estimates it, '' = none), ARGV[5] delay ms
-- returns: the new due time (ms) of the pending item of the key, due at the issue time (when sane,
-- as OFFER) + delay; false if none was pending. Publishes the due time when it becomes the
-- earliest pending one (of its zset). A resend of the call id returns the first run's answer.
if first_run(K, ARGV[1]) then
  local r = redis.call('hget', K.call_replies, ARGV[1])
  if r == '' then return false end
  return tonumber(r)
end
local now = now_ms()
local v, score, field, zset = index_find(K, ARGV[3], ARGV[2])
local due = false
if score then
  due = issue_base(ARGV[4], now) + tonumber(ARGV[5])
  local head = redis.call('zrange', zset, 0, 0, 'WITHSCORES')  -- (a grouped item's zset: K.grouped)
  redis.call('zadd', zset, 'XX', due, v)
  if head[2] == nil or due < tonumber(head[2]) then
    redis.call('publish', K.channel, string.format('%d', due))
  end
  if events_on(K) then
    local payload = parse(v)
    event_add(K, 'rescheduled', ARGV[2], nil, payload and group_of(payload))
  end
elseif field then
  redis.call('hdel', K.key_index, field)
end
remember(K, ARGV[1], now, due and string.format('%d', due) or '')
return due
