-- defines: issue_base MAX_ISSUE_AGE_MS
-- The base of due times for a call the client issued at `issued` (server ms as it estimates them,
-- '' when it has no estimate): the issue time when it is sane (not after now, at most
-- MAX_ISSUE_AGE_MS before it), else now.
local MAX_ISSUE_AGE_MS = 1000
local function issue_base(issued, now)
  local t = tonumber(issued)
  if t and t <= now and t >= now - MAX_ISSUE_AGE_MS then return math.floor(t) end
  return now
end
