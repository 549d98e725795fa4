"""Keys of pending items: what an ``offer`` with a key returns (:class:`Offered`), what ``get``
returns (:class:`Pending`), and ``cancel``/``reschedule``/``get`` (:class:`KeyedItems`).

A key is unique among a queue's pending items. The key index (``QueueKeys.key_index``) maps the key's
tag (``_wire/item_keys.py``) to the element, whose id carries the tag, so a transfer frees the key of
what it moves. Writes carry a call id, so a resend answers as the first run did.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Generic, TypeVar

from .._redis.client_facts import facts_for
from .._scripts import BoundScript, QueueScripts
from .._wire.codec import Codec, decode_item
from .._wire.delays import delay_to_ms
from .._wire.elements import unwrap
from .._wire.item_keys import check_key, key_tag

__all__ = ["KeyedItems", "Offered", "Pending", "parse_outcome"]

T = TypeVar("T")


class Offered(int):
    """An offered item's due time (server epoch ms, an ``int``) and, for a keyed offer, what happened.

    Attributes:
        key: the item's key (``None`` without one; ``content:...`` with ``dedupe_by_content``).
        added: ``True`` if this call wrote the item; ``False`` if the key was taken and nothing
            changed (then the value is the due time of the item that took it).
        replaced: ``True`` if ``replace=True`` replaced a pending item of this key.
        deduplicated: ``True`` if the key was taken, by a pending item or by an open deduplication
            window (``dedupe_for``), and nothing was written: the negation of ``added``.
    """

    key: str | None
    added: bool
    replaced: bool
    deduplicated: bool

    def __new__(cls, due_ms: int, *, key: str | None, added: bool = True, replaced: bool = False,
                deduplicated: bool = False) -> Offered:
        self = super().__new__(cls, due_ms)
        self.key, self.added, self.replaced, self.deduplicated = key, added, replaced, deduplicated
        return self

    @property
    def due_ms(self) -> int:
        """The due time as a plain ``int``."""
        return int(self)

    def __repr__(self) -> str:
        return (f"Offered({int(self)}, key={self.key!r}, added={self.added}, replaced={self.replaced}, "
                f"deduplicated={self.deduplicated})")


@dataclass(frozen=True)
class Pending(Generic[T]):
    """A pending keyed item (:meth:`DelayedQueue.get`).

    Attributes:
        key: its key.
        value: the decoded item.
        due_ms: when it falls due, epoch ms of the server clock.
        headers: the headers it was offered with (``{}`` when none).
        expires_at_ms: when it expires, epoch ms of the server clock (``None``: never).
        recurring: it is the next occurrence of a recurring item (:meth:`DelayedQueue.schedule`).
        group: the group it was offered in (``None``: none).
    """

    key: str
    value: T
    due_ms: int
    headers: dict[str, str] = field(default_factory=dict)
    expires_at_ms: int | None = None
    recurring: bool = False
    group: str | None = None


def parse_outcome(outcome: bytes, count: int) -> list[tuple[str, int | None]]:
    """OFFER's outcome of a keyed call: per item ``(letter, due ms of the item that holds its key
    (``p``: pending, ``d``: its window) or None)``.

    Raises:
        ValueError: a reply that does not match ``count`` items.
    """
    letters, *dues = outcome.decode().split(",")
    if len(letters) != count or letters.count("p") + letters.count("d") != len(dues):
        raise ValueError(f"unexpected offer outcome {outcome!r} for {count} items")
    kept = iter(int(d) for d in dues)
    return [(letter, next(kept) if letter in "pd" else None) for letter in letters]


class KeyedItems:
    """``cancel``/``reschedule``/``get`` of one queue object (see :class:`~aiodelayq.DelayedQueue`)."""

    def __init__(self, scripts: QueueScripts, codec: Codec) -> None:
        self._scripts, self._keys, self._codec = scripts, scripts.keys, codec

    def __repr__(self) -> str:
        return f"<KeyedItems {self._keys.key_index!r}>"

    async def _write(self, script: BoundScript, args: list[Any]) -> Any:
        """A durable write with a call id (a resend answers as the first run)."""
        return await script.resend(os.urandom(16), *args, durable=True)

    async def cancel(self, key: str) -> bool:
        """Remove the pending item of ``key``; whether there was one."""
        raw = check_key(key)
        return bool(int(await self._write(self._scripts.cancel, [raw, key_tag(raw)])))

    async def reschedule(self, key: str, delay: float | timedelta) -> int | None:
        """Make the pending item of ``key`` due ``delay`` after the call; its new due time, or
        ``None`` when no item of that key is pending."""
        raw = check_key(key)
        delay_ms = delay_to_ms(delay)
        issued = facts_for(self._scripts.client).clock.issue_arg(asyncio.get_running_loop().time())
        reply = await self._write(self._scripts.reschedule, [raw, key_tag(raw), issued, delay_ms])
        return None if reply is None else int(reply)

    async def get(self, key: str) -> Pending[Any] | None:
        """The pending item of ``key`` (decoded), or ``None``."""
        raw = check_key(key)
        reply = await self._scripts.get.resend(raw, key_tag(raw))
        if reply is None:
            return None
        unwrapped = unwrap(reply[0])
        return Pending(key, decode_item(self._codec, unwrapped.payload), int(reply[1]), unwrapped.headers,
                       unwrapped.expires_at_ms, unwrapped.schedule_key is not None, unwrapped.group)
