"""The pending side: what is scheduled and not yet due, plus the dead-letter list (Redisson's
``RDelayedQueue`` read/cancel calls)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from redis.asyncio import Redis

from ._codec import Codec, decode_item, encode_item
from ._connections import call, run_script
from ._keys import QueueKeys
from ._scripts import CONTAINS, READ_ALL, REMOVE

__all__ = ["PendingView"]


class PendingView:
    """``size``/``contains``/``read_all``/``remove``/``clear``/``dead_letters`` of one queue."""

    def __init__(self, client: Redis, keys: QueueKeys, codec: Codec, *, call_timeout_s: float) -> None:
        self._client = client
        self._keys = keys
        self._codec = codec
        self._timeout_s = call_timeout_s

    def __repr__(self) -> str:
        return f"<PendingView {self._keys.destination!r}>"

    async def _call(self, *args: Any, what: str) -> Any:
        return await call(self._client, *args, what=what, timeout_s=self._timeout_s)

    async def size(self) -> int:
        """``ZCARD`` of the timeout zset: every pending element."""
        return int(await self._call("ZCARD", self._keys.timeout_set, what="size"))

    async def ready_size(self) -> int:
        """``LLEN`` of the destination list."""
        return int(await self._call("LLEN", self._keys.destination, what="ready_size"))

    async def contains(self, item: Any) -> bool:
        """Whether a pending element carries ``item``'s encoded payload."""
        payload = encode_item(self._codec, item)
        k = self._keys
        return bool(await run_script(self._client, CONTAINS, [k.delay_list, k.timeout_set], [payload],
                                     timeout_s=self._timeout_s, what="contains"))

    async def read_all(self) -> list[Any]:
        """Pending items (see :meth:`DelayedQueue.read_all`)."""
        k = self._keys
        payloads = await run_script(self._client, READ_ALL, [k.delay_list, k.timeout_set], [],
                                    timeout_s=self._timeout_s, what="read_all")
        return [decode_item(self._codec, p) for p in payloads]

    async def remove(self, items: Iterable[Any], *, first_only: bool) -> int:
        """Cancel pending elements matching ``items``; returns how many."""
        payloads = [encode_item(self._codec, item) for item in items]
        if not payloads:
            return 0
        k = self._keys
        return int(await run_script(self._client, REMOVE, [k.delay_list, k.timeout_set],
                                    ["1" if first_only else "0", *payloads], timeout_s=self._timeout_s,
                                    what="remove"))

    async def clear(self) -> None:
        """``UNLINK`` both pending keys (freed in the background: a huge zset does not block the server)."""
        await self._call("UNLINK", self._keys.delay_list, self._keys.timeout_set, what="clear")

    async def dead_letters(self) -> list[bytes]:
        """The raw entries of the dead-letter list."""
        entries: list[bytes] = await self._call("LRANGE", self._keys.dead_letter, 0, -1, what="dead_letters")
        return entries
