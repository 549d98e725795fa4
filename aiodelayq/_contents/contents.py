"""What a queue holds, read and edited: sizes, counts, peeks, and the pending side's walks (Redisson's
``RDelayedQueue`` read and remove calls).

``contains``, ``read_all``, ``remove`` and ``remove_all`` walk the timeout zset (every pending
element but the tiered ones), then the tier's buckets, one short script call per page, so no call
holds the server long. The zset cursor is the (score, member) last seen, which survives concurrent
changes; the tier's is bucket, position and entry (``lua/lib/tier_walk.lua``). No element is seen
twice; one that moves or is added during the walk may or may not be seen.

Removal happens inside the page script that finds the match. A removing page remembers its reply
under a call id for 60 s, so a resend after a lost reply answers as the first run did.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from .._redis.retry import call_idempotent, resend_within
from .._scripts import PAGE_SIZE, BoundScript, QueueScripts
from .._wire.codec import Codec, decode_item, decode_stored, encode_item
from .._wire.elements import ITEM_MAGIC, unwrap, wrap
from ..exceptions import ConfigurationError, DecodeError
from .counts import QueueCounts

__all__ = ["MAX_PEEK", "PendingItem", "QueueContents"]

T = TypeVar("T")

# Most elements one peek() returns: one short script call, whatever the backlog.
MAX_PEEK = 1000
# Buckets one CLEAR call drops (lua/clear.lua).
CLEAR_BUCKETS = 500


@dataclass(frozen=True)
class PendingItem(Generic[T]):
    """One pending element as :meth:`DelayedQueue.peek` shows it.

    Attributes:
        due_ms: when it falls due, epoch ms of the server clock.
        value: the decoded item; ``None`` when ``decodable`` is ``False``.
        raw: the payload bytes as the codec wrote them (a malformed element: the whole element).
        key: its key when it was offered with one and is indexed, else ``None``.
        decodable: whether the codec could decode ``raw`` (``False`` for malformed elements too).
        malformed: the element is not a valid packed element (the transfer dead-letters it).
        headers: the headers it was offered with (``{}`` when none).
        expires_at_ms: when it expires, epoch ms of the server clock (``None``: never).
        recurring: it is the next occurrence of a recurring item (:meth:`DelayedQueue.schedule`).
        group: the group it was offered in (``None``: none).
    """

    due_ms: int
    value: T | None
    raw: bytes
    key: str | None = None
    decodable: bool = True
    malformed: bool = False
    headers: dict[str, str] = field(default_factory=dict)
    expires_at_ms: int | None = None
    recurring: bool = False
    group: str | None = None


class QueueContents:
    """What one queue holds, read and edited: ``size``, ``ready_size``, ``counts``, ``peek``,
    ``contains``, ``read_all``, ``remove`` and ``clear``.

    Attributes:
        page_size: most elements one page script call reads (tests lower it to walk many pages).
    """

    def __init__(self, scripts: QueueScripts, codec: Codec, *, page_size: int = PAGE_SIZE) -> None:
        self._scripts = scripts
        self._client = scripts.client
        self._keys = scripts.keys
        self._codec = codec
        self._timeout_s = scripts.call_timeout_s
        self.page_size = page_size

    def __repr__(self) -> str:
        return f"<QueueContents {self._keys.destination!r}>"

    async def _call(self, *args: Any, what: str) -> Any:
        """A read, or ``UNLINK``, resent within ``call_timeout_s``; args[1] (a key) routes it on a cluster."""
        return await call_idempotent(self._client, *args, what=what, timeout_s=self._timeout_s, route=args[1])

    async def _page(self, script: BoundScript, args: Sequence[Any], *, what: str,
                    resend_args: Sequence[Any] | None = None) -> Any:
        """One page script call, resent (with ``resend_args`` if given) within ``call_timeout_s``:
        read pages only read, a remove page carries its call id.

        Raises:
            BackendError: a refusal (script error, OOM), a permanent error, or still failing when the
                bound ends; ``maybe_applied`` if any attempt may have been applied.
        """
        return await resend_within(
            lambda remaining_s, resend: script(*(resend_args if resend and resend_args is not None else args),
                                               what=what, timeout_s=remaining_s),
            timeout_s=self._timeout_s)

    async def size(self) -> int:
        """Every pending element: the zset's plus the tier's count (one read-only call)."""
        return int(await self._page(self._scripts.size, [], what=f"size of {self._keys.destination!r}"))

    async def ready_size(self) -> int:
        """``LLEN`` of the destination list."""
        return int(await self._call("LLEN", self._keys.destination, what="ready_size"))

    async def counts(self) -> QueueCounts:
        """The queue's counts and earliest due time (one read-only call)."""
        k = self._keys
        reply = await self._page(self._scripts.counts, [], what=f"counts of {k.destination!r}")
        head, rate, burst, cap = reply[4], reply[6], reply[7], reply[11]
        return QueueCounts(int(reply[0]), int(reply[1]), int(reply[2]), int(reply[3]),
                           None if head is None else int(float(head)), paused=bool(reply[5]),
                           rate_limit_per_s=None if rate is None else float(rate),
                           rate_burst=None if burst is None else int(burst), recurring=int(reply[8]),
                           lag_ms=int(reply[9]), tiered=int(reply[10]),
                           concurrency_limit=None if cap is None else int(cap), groups=int(reply[12]),
                           group_concurrency=int(reply[13]), deduplicating=int(reply[14]))

    async def peek(self, limit: int) -> list[PendingItem[Any]]:
        """The ``limit`` soonest-due pending elements, tier included, decoded where possible.

        Raises:
            ConfigurationError: ``limit`` is not an ``int`` in 1..``MAX_PEEK``.
        """
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_PEEK:
            raise ConfigurationError(f"limit must be an int from 1 to {MAX_PEEK}, not {limit!r}")
        k = self._keys
        reply = await self._page(self._scripts.peek, [limit], what=f"peek of {k.destination!r}")
        items: list[PendingItem[Any]] = []
        for i in range(0, len(reply), 4):
            element, score, payload, key = reply[i:i + 4]
            due_ms = int(float(score))
            key_text = None if key is None else key.decode("utf-8", "replace")
            if payload is None:
                items.append(PendingItem(due_ms, None, element, key_text, decodable=False, malformed=True))
                continue
            unwrapped = unwrap(payload)
            try:
                value, decodable = decode_item(self._codec, unwrapped.payload), True
            except DecodeError:
                value, decodable = None, False
            items.append(PendingItem(due_ms, value, unwrapped.payload, key_text, decodable, headers=unwrapped.headers,
                                     expires_at_ms=unwrapped.expires_at_ms,
                                     recurring=unwrapped.schedule_key is not None, group=unwrapped.group))
        return items

    async def contains(self, item: Any) -> bool:
        """Whether a pending element carries ``item``'s encoded payload (pages until a match)."""
        payload = _stored(encode_item(self._codec, item))
        what = f"contains on {self._keys.destination!r}"
        score: bytes = b""
        member: bytes = b""
        while True:
            reply = await self._page(self._scripts.contains_page, [score, member, self.page_size, payload], what=what)
            if reply[0]:
                return True
            if len(reply) < 3:
                return False
            score, member = reply[1], reply[2]

    async def read_all(self) -> list[Any]:
        """Pending items in zset (due) order, then the tier's (see :meth:`DelayedQueue.read_all`)."""
        what = f"read_all on {self._keys.destination!r}"
        payloads: list[bytes] = []
        score: bytes = b""
        member: bytes = b""
        while True:
            reply = await self._page(self._scripts.read_page, [score, member, self.page_size], what=what)
            payloads.extend(reply[2:])
            if reply[0] is None:
                return [decode_stored(self._codec, p) for p in payloads]
            score, member = reply[0], reply[1]

    async def remove(self, items: Iterable[Any], *, first_only: bool) -> int:
        """Cancel pending elements matching ``items`` (only the first found, in walk order, with
        ``first_only``); returns how many this call removed."""
        payloads = list(dict.fromkeys(_stored(encode_item(self._codec, item)) for item in items))
        if not payloads:
            return 0
        what = f"remove on {self._keys.destination!r}"
        removed = 0
        score: bytes = b""
        member: bytes = b""
        while True:
            call_id = os.urandom(16)  # one per page; a resend of the page reuses it
            head = [call_id, score, member, self.page_size, "1" if first_only else "0"]
            reply = await self._page(self._scripts.remove_page, [*head, "0", *payloads], what=what,
                                     resend_args=[*head, "1", *payloads])
            removed += int(reply[0])
            if reply[1] is None or (first_only and removed):
                return removed
            score, member = reply[1], reply[2]

    async def clear(self) -> None:
        """``UNLINK`` the pending keys, key index and schedules (freed in the background), then the
        tier in CLEAR calls of ``CLEAR_BUCKETS`` (idempotent, so resent); the pages stop at an empty
        index or after as many as the first reply needs (items offered meanwhile may stay)."""
        what = f"clear of {self._keys.destination!r}"
        left = int(await self._page(self._scripts.clear, ["1"], what=what))
        for _ in range(left // CLEAR_BUCKETS + 1):
            if left == 0:
                return
            left = int(await self._page(self._scripts.clear, ["0"], what=what))


def _stored(payload: bytes) -> bytes:
    """``payload`` as a plain offer stores it (wrapped if it looks like an envelope)."""
    return wrap(payload, b"", None) if payload.startswith(ITEM_MAGIC) else payload
