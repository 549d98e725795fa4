"""The pending side: what is scheduled and not yet due, plus the dead-letter list (Redisson's
``RDelayedQueue`` read/cancel calls).

``contains``, ``read_all``, ``remove`` and ``remove_all`` walk the timeout zset in pages, one short
script call per page, so no call holds the server for long whatever the backlog (Redis runs nothing
else while a script runs). The zset holds every pending element (fast, strict, legacy, Java-written);
Redisson's insertion-order list holds only the non-fast ones, so walking the zset alone sees
everything. The walk goes in zset order, score (due ms) then member bytes, with a cursor that is the
(score, member) of the last element seen: it survives concurrent changes (transfers remove elements
from the low end, offers add anywhere, other removals anywhere), so no element is seen twice, an
element pending during the whole walk is seen once, and one that moves or is added during the walk
may or may not be seen.

Removal happens inside the page script that finds the match, so it is atomic with the check. A page
call that removed something remembers its reply under a call id for the call window (60 s): after a
lost reply the page is resent with the same id and answers as the first run did, so ``remove()``
never reports ``False`` for a removal its own first attempt made.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from typing import Any

from redis.asyncio import Redis

from ._codec import Codec, decode_item, encode_item
from ._connections import Script, call, run_script
from ._keys import QueueKeys
from ._retry import resend_within
from ._scripts import _PRELUDE

__all__ = ["CONTAINS_PAGE", "PAGE_SIZE", "READ_PAGE", "REMOVE_PAGE", "PendingView"]

# Elements one page script reads at most. Measured with a million pending fast elements (12-byte
# payloads) on a shared 2-core machine (tests/test_pending_scale.py): a page of 1000 takes 0.6-0.9 ms
# of server time on average for contains/remove and 1.0-1.9 ms for read_all (which returns every
# payload), at most ~2.7 ms; a walk of the million takes ~0.8 s (contains, remove) and ~3 s
# (read_all, mostly client-side decoding). Pages of 2000 saved little (contains 0.65 s instead of
# 0.75 s) and doubled the page cost. A page also stops after about 256 KiB of elements
# (PAGE_BYTES below), so large payloads cannot make it long either; the one exception is a single
# element of a megabyte or more: a page reads at least one, and copying it costs a few ms per MB in
# any script that reads it (TRANSFER too).
PAGE_SIZE = 1000

# The walk shared by the page scripts (after the prelude, which brings ``parse``, ``now_ms``,
# ``first_run``/``remember`` and ``pack_list``/``unpack_list``).
_WALK = _PRELUDE + """
local PAGE_BYTES = 262144
local CHUNK = 128
-- a < b in byte order, as the zset orders members of equal score (memcmp). Lua's own '<' uses the
-- server's locale collation (strcoll), which need not be byte order.
local function bytes_lt(a, b)
  local na, nb = string.len(a), string.len(b)
  for i = 1, math.min(na, nb) do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then return x < y end
  end
  return na < nb
end
-- The rank of the first element after the cursor (score as text, member); 0 without a cursor
-- (score ''). If the cursor element is still there, the rank after it; else (it fell due or was
-- removed) a binary search for the first member after it among the elements of its score.
local function start_rank(zset, score, member)
  if score == '' then return 0 end
  local s = redis.call('zscore', zset, member)
  if s and tonumber(s) == tonumber(score) then return redis.call('zrank', zset, member) + 1 end
  local lo = redis.call('zcount', zset, '-inf', '(' .. score)
  local hi = redis.call('zcount', zset, '-inf', score)
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    if bytes_lt(member, redis.call('zrange', zset, mid, mid)[1]) then hi = mid else lo = mid + 1 end
  end
  return lo
end
-- One page of the walk: calls fn(element) for the elements after the cursor, in zset order, at
-- most `limit` of them and about PAGE_BYTES bytes (at least one); fn returning true ends the page
-- there. fn must not change the zset (ranks would shift): collect, then write. Returns the cursor
-- of the last element given to fn (score text, member), or nil when the zset ended first.
-- Elements are fetched in batches sized by the average element so far (the first batch is one
-- element), so a page of large elements does not copy many more than it uses.
local function walk_page(zset, score, member, limit, fn)
  local rank = start_rank(zset, score, member)
  local seen, bytes, want = 0, 0, 1
  while true do
    local batch = redis.call('zrange', zset, rank, rank + want - 1)
    for _, v in ipairs(batch) do
      seen = seen + 1
      bytes = bytes + string.len(v)
      if fn(v) or seen >= limit or bytes >= PAGE_BYTES then return redis.call('zscore', zset, v), v end
    end
    if #batch < want then return nil end
    rank = rank + #batch
    want = math.max(1, math.min(CHUNK, limit - seen, math.floor((PAGE_BYTES - bytes) * seen / bytes)))
  end
end
-- A test for "v carries one of these payloads": returns the payload and is_fast, or nil. The
-- element's length is checked first (header sizes of the three formats), so most elements are
-- never unpacked.
local function matcher(payloads)
  local wanted, sizes = {}, {}
  for _, p in ipairs(payloads) do
    wanted[p] = true
    for _, h in ipairs({8 + LSZ, 9 + LSZ, 21 + LSZ}) do sizes[string.len(p) + h] = true end
  end
  return function(v)
    if not sizes[string.len(v)] then return nil end
    local payload, fast = parse(v)
    if payload and wanted[payload] then return payload, fast end
    return nil
  end
end
"""

CONTAINS_PAGE = Script("contains_page", _WALK + """
-- KEYS[1] timeout zset
-- ARGV[1] cursor score ('' = from the start), ARGV[2] cursor member, ARGV[3] page size,
-- ARGV[4] payload
-- returns: {1} if an element of this page carries the payload; else {0, cursor score, cursor
-- member} to go on from, or {0} when the walk is over. Read-only.
local match = matcher({ARGV[4]})
local found = false
local score, member = walk_page(KEYS[1], ARGV[1], ARGV[2], tonumber(ARGV[3]), function(v)
  found = match(v) ~= nil
  return found
end)
if found then return {1} end
if score then return {0, score, member} end
return {0}
""")

READ_PAGE = Script("read_page", _WALK + """
-- KEYS[1] timeout zset
-- ARGV[1] cursor score ('' = from the start), ARGV[2] cursor member, ARGV[3] page size
-- returns: {cursor score, cursor member, payloads...}: the payloads of this page's elements in zset
-- order (malformed elements skipped); the cursor is false, false when the walk is over. Read-only.
local out = {false, false}
local score, member = walk_page(KEYS[1], ARGV[1], ARGV[2], tonumber(ARGV[3]), function(v)
  local payload = parse(v)
  if payload then out[#out + 1] = payload end
end)
if score then out[1], out[2] = score, member end
return out
""")

REMOVE_PAGE = Script("remove_page", _WALK + """
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
""")


class PendingView:
    """``size``/``contains``/``read_all``/``remove``/``clear``/``dead_letters`` of one queue.

    Attributes:
        page_size: most elements one page script call reads (tests lower it to walk many pages).
    """

    def __init__(self, client: Redis, keys: QueueKeys, codec: Codec, *, call_timeout_s: float,
                 page_size: int = PAGE_SIZE) -> None:
        self._client = client
        self._keys = keys
        self._codec = codec
        self._timeout_s = call_timeout_s
        self.page_size = page_size

    def __repr__(self) -> str:
        return f"<PendingView {self._keys.destination!r}>"

    async def _call(self, *args: Any, what: str) -> Any:
        return await call(self._client, *args, what=what, timeout_s=self._timeout_s)

    async def _page(self, script: Script, keys: Sequence[str], args: Sequence[Any], *, what: str,
                    resend_args: Sequence[Any] | None = None) -> Any:
        """One page script call, resent after a connection failure or timeout (with ``resend_args``
        if given), with backoff, until ``call_timeout_s`` after the first send. Resending is
        harmless: read pages only read, a remove page carries its call id.

        Raises:
            BackendError: a refusal (script error, OOM), a permanent error, or still failing when the
                bound ends; ``maybe_applied`` if any attempt may have been applied.
        """
        return await resend_within(
            lambda remaining_s, resend: run_script(
                self._client, script, keys, resend_args if resend and resend_args is not None else args,
                what=what, timeout_s=remaining_s),
            timeout_s=self._timeout_s)

    async def size(self) -> int:
        """``ZCARD`` of the timeout zset: every pending element."""
        return int(await self._call("ZCARD", self._keys.timeout_set, what="size"))

    async def ready_size(self) -> int:
        """``LLEN`` of the destination list."""
        return int(await self._call("LLEN", self._keys.destination, what="ready_size"))

    async def contains(self, item: Any) -> bool:
        """Whether a pending element carries ``item``'s encoded payload (pages until a match)."""
        payload = encode_item(self._codec, item)
        keys = [self._keys.timeout_set]
        what = f"contains on {self._keys.destination!r}"
        score: bytes = b""
        member: bytes = b""
        while True:
            reply = await self._page(CONTAINS_PAGE, keys, [score, member, self.page_size, payload], what=what)
            if reply[0]:
                return True
            if len(reply) < 3:
                return False
            score, member = reply[1], reply[2]

    async def read_all(self) -> list[Any]:
        """Pending items in zset (due) order (see :meth:`DelayedQueue.read_all`)."""
        keys = [self._keys.timeout_set]
        what = f"read_all on {self._keys.destination!r}"
        payloads: list[bytes] = []
        score: bytes = b""
        member: bytes = b""
        while True:
            reply = await self._page(READ_PAGE, keys, [score, member, self.page_size], what=what)
            payloads.extend(reply[2:])
            if reply[0] is None:
                return [decode_item(self._codec, p) for p in payloads]
            score, member = reply[0], reply[1]

    async def remove(self, items: Iterable[Any], *, first_only: bool) -> int:
        """Cancel pending elements matching ``items`` (only the first found, in zset order, with
        ``first_only``); returns how many this call removed."""
        payloads = list(dict.fromkeys(encode_item(self._codec, item) for item in items))
        if not payloads:
            return 0
        k = self._keys
        keys = [k.timeout_set, k.delay_list, k.calls, k.call_replies]
        what = f"remove on {k.destination!r}"
        removed = 0
        score: bytes = b""
        member: bytes = b""
        while True:
            call_id = os.urandom(16)  # one per page; a resend of the page reuses it
            head = [call_id, score, member, self.page_size, "1" if first_only else "0"]
            reply = await self._page(REMOVE_PAGE, keys, [*head, "0", *payloads], what=what,
                                     resend_args=[*head, "1", *payloads])
            removed += int(reply[0])
            if reply[1] is None or (first_only and removed):
                return removed
            score, member = reply[1], reply[2]

    async def clear(self) -> None:
        """``UNLINK`` both pending keys (freed in the background: a huge zset does not block the server)."""
        await self._call("UNLINK", self._keys.delay_list, self._keys.timeout_set, what="clear")

    async def dead_letters(self) -> list[bytes]:
        """The raw entries of the dead-letter list."""
        entries: list[bytes] = await self._call("LRANGE", self._keys.dead_letter, 0, -1, what="dead_letters")
        return entries
