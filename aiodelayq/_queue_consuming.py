"""The consuming calls of :class:`~aiodelayq.DelayedQueue`: ``take``, ``poll`` and ``receive``,
delegated to the take pump or the reliable consumer of the open queue's lifecycle (``_parts/roles.py``).
The facade is made of this class, :class:`~aiodelayq._queue_contents.ContentsCalls` and its own calls."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Generic, TypeVar, cast

from ._consuming.messages import Message
from ._consuming.reliable import MessageIterator
from ._consuming.take import NOT_PREFETCHED
from ._parts.roles import Life, Taker
from ._util.checks import check_max_items, check_timeout
from ._wire.delays import visibility_ms
from .exceptions import QueueClosedError

__all__ = ["ConsumingCalls"]

T = TypeVar("T")


async def items_of(pump: Taker) -> AsyncIterator[Any]:
    """``async for``'s items, as :meth:`ConsumingCalls.take` returns them, until the queue closes: a
    generator resumed per item costs less than a coroutine made per item, and the prefetched ones come
    without a call to a coroutine at all."""
    get_prefetched, get = pump.get_prefetched, pump.get
    try:
        while True:
            taken = get_prefetched()
            yield taken if taken is not NOT_PREFETCHED else (await get(None, 1))[0]
    except QueueClosedError:
        return


class ConsumingCalls(Generic[T]):
    """``take``, ``poll``, ``receive`` and their kin, of an open :class:`~aiodelayq.DelayedQueue`."""

    _life: Life

    async def take(self) -> T:
        """Wait for the next due item and return it. Cancellation-safe: a caller that gives up never
        loses an item Redis already popped; it goes to the next caller or back to the list.

        Raises:
            QueueNotOpenError: the queue is not open.
            QueueClosedError: the queue was closed while waiting.
            AccessDeniedError: the user may not pop from the queue.
        """
        pump = self._life.pump()
        taken = pump.get_prefetched()  # async for's hot path: no coroutine while items are prefetched
        return cast(T, taken if taken is not NOT_PREFETCHED else (await pump.get(None, 1))[0])

    async def take_many(self, max_items: int, timeout: float | None = None) -> list[T]:
        """Wait for at least one due item and return up to ``max_items`` of them in one round trip, or
        ``[]`` after ``timeout`` seconds (``None``: forever; 0: one pop attempt, no waiting).
        Cancellation-safe like :meth:`take`. Raises as :meth:`take`, :class:`ConfigurationError` for
        ``max_items`` < 1 and :class:`InvalidDelayError` for a negative or NaN timeout."""
        pump = self._life.pump()
        count = check_max_items(max_items)
        check_timeout(timeout)
        return cast(list[T], await pump.get(timeout, count))

    async def take_with_headers(self) -> tuple[T, dict[str, str]]:
        """As :meth:`take`, with the headers the item was offered with (``{}`` when none).
        Raises as :meth:`take`."""
        return cast("tuple[T, dict[str, str]]", (await self._life.pump().get(None, 1, with_headers=True))[0])

    async def take_many_with_headers(self, max_items: int, timeout: float | None = None
                                     ) -> list[tuple[T, dict[str, str]]]:
        """As :meth:`take_many`, each item with its headers (``{}`` when none). Raises as :meth:`take_many`."""
        pump = self._life.pump()
        count = check_max_items(max_items)
        check_timeout(timeout)
        return cast("list[tuple[T, dict[str, str]]]", await pump.get(timeout, count, with_headers=True))

    async def poll(self, timeout: float | None = None) -> T | None:
        """Return a due item, or ``None`` if none arrives within ``timeout`` seconds (``None`` or 0:
        one pop attempt, no waiting). Cancellation-safe like :meth:`take`; raises as :meth:`take_many`."""
        pump = self._life.pump()
        check_timeout(timeout)
        items = await (pump.get(timeout, 1) if timeout else pump.get(None, 1, once=True))
        return cast(T, items[0]) if items else None

    # -- reliable consumption (at-least-once) ----------------------------------------------------

    async def receive(self, visibility_timeout: float, timeout: float | None = None) -> Message[T] | None:
        """Wait for a due item and return it as a :class:`Message`, in flight until acked: one not
        acked (or nacked) within ``visibility_timeout`` seconds is delivered again with
        ``delivery_count`` + 1; past ``max_deliveries`` it goes to the dead-letter list. ``None``
        after ``timeout`` seconds (``None``: wait forever).

        Raises:
            QueueNotOpenError, QueueClosedError: as :meth:`take`.
            InvalidDelayError: a bad ``visibility_timeout`` or ``timeout``.
            BackendError: the receive call failed.
        """
        messages = await self.receive_many(1, visibility_timeout, timeout)
        return messages[0] if messages else None

    async def receive_many(self, max_items: int, visibility_timeout: float,
                           timeout: float | None = None) -> list[Message[T]]:
        """Like :meth:`receive`, for up to ``max_items`` messages in one round trip; ``[]`` on timeout.
        Raises as :meth:`receive`, and :class:`ConfigurationError` for ``max_items`` < 1."""
        reliable = self._life.reliable()
        count = check_max_items(max_items)
        check_timeout(timeout)
        return await reliable.receive_many(count, visibility_ms(visibility_timeout), timeout)

    def messages(self, visibility_timeout: float) -> MessageIterator[T]:
        """``async for msg in queue.messages(30.0)``: :meth:`receive` until the queue is closed (raises
        as :meth:`receive`)."""
        return MessageIterator(self._life.reliable(), visibility_ms(visibility_timeout))
