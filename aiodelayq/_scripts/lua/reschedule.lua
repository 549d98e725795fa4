-- RESCHEDULE: move the pending element of a key to a new due time, once per call id.
-- KEYS: timeout_set delay_list key_index channel calls call_replies
-- uses: lib/calls.lua lib/clock.lua lib/index.lua lib/issue.lua
-- KEYS as CANCEL
-- ARGV[1] call id, ARGV[2] key, ARGV[3] its tag, ARGV[4] issue time (server ms as the client
-- estimates it, '' = none), ARGV[5] delay ms
-- returns: the new due time (ms) of the pending item of the key, due at the issue time (when sane,
-- as OFFER) + delay; false if none was pending. Publishes the due time when it becomes the
-- earliest pending one. A resend of the call id returns the first run's answer.
if first_run(KEYS[5], ARGV[1]) then
  local r = redis.call('hget', KEYS[6], ARGV[1])
  if r == '' then return false end
  return tonumber(r)
end
local now = now_ms()
local v, score, field = index_find(KEYS[3], KEYS[1], ARGV[3], ARGV[2])
local due = false
if score then
  due = issue_base(ARGV[4], now) + tonumber(ARGV[5])
  local head = redis.call('zrange', KEYS[1], 0, 0, 'WITHSCORES')
  redis.call('zadd', KEYS[1], 'XX', due, v)
  if head[2] == nil or due < tonumber(head[2]) then
    redis.call('publish', KEYS[4], string.format('%d', due))
  end
elseif field then
  redis.call('hdel', KEYS[3], field)
end
remember(KEYS[5], KEYS[6], ARGV[1], now, due and string.format('%d', due) or '')
return due
