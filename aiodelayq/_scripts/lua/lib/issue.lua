-- defines: issue_base MAX_ISSUE_AGE_MS
-- The base of due times for a call the client issued at `issued` (server ms as it estimates them,
-- '' when it has no estimate): the issue time when it is sane (within MAX_ISSUE_AGE_MS of now; an
-- estimate is never behind the server, so a call that runs at once may find it a little ahead),
-- else now. The calls of one offer_many share its issue time: items of one delay keep their order
-- whichever call lands first.
local MAX_ISSUE_AGE_MS = 1000
local function issue_base(issued, now)
  local t = tonumber(issued)
  if t and t <= now + MAX_ISSUE_AGE_MS and t >= now - MAX_ISSUE_AGE_MS then return math.floor(t) end
  return now
end
