-- defines: wake_consumers
-- Consumers that found nothing look again: an ack made room in a group or under the concurrency
-- limit, items went back to a list's head, a control changed. Nothing became due, so the message
-- is the server time with a leading '+': aiodelayq's subscribers wake their queue's consumers
-- without a transfer, and Redisson's (Long.valueOf reads '+<ms>' as <ms>, a due time already
-- reached) run their transfer, as for any due time.
local function wake_consumers(K, now)
  redis.call('publish', K.channel, string.format('+%d', now))
end
