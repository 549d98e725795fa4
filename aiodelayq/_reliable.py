"""Reliable (at-least-once) consumption: messages in flight until acknowledged.

A received message sits in the in-flight zset, scored by its visibility deadline (server ms). ``ack``
removes it; ``nack(delay)`` makes it visible again after ``delay``; a message neither acked nor
nacked becomes visible again at its deadline. Each redelivery counts; past ``max_deliveries`` the
payload goes to the dead-letter list. The receive script pops and registers in one atomic step, so a
lost reply, a cancelled caller or a consumer that dies only delays a message, never loses it.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Generic, TypeVar

if TYPE_CHECKING:
    from ._queue import DelayedQueue

__all__ = ["Message", "MessageIterator", "parse_message"]

T = TypeVar("T")

_MAGIC = b"adq\x02"
_HEADER = struct.Struct(">I d")  # delivery count, due ms of this delivery (0: unknown)


@dataclass(eq=False)
class Message(Generic[T]):
    """One delivery of a queue item, in flight until :meth:`ack` or :meth:`nack`.

    Attributes:
        value: the decoded item.
        id: the message id (hex), stable across redeliveries.
        delivery_count: 1 for the first delivery, then +1 per redelivery.
        due_ms: when this delivery became due, epoch ms of the server clock: the end of the previous
            visibility timeout or nack delay; ``None`` for a first delivery (the destination list
            carries only the payload, as Redisson's does).
    """

    value: T
    id: str
    delivery_count: int
    due_ms: int | None
    _queue: DelayedQueue[T] = field(repr=False)
    _element: bytes = field(repr=False)

    async def ack(self) -> bool:
        """Done: remove the message for good. ``False`` if it was no longer in flight as this delivery
        (already settled, or its visibility timeout ended and it was delivered again).

        Raises:
            BackendError: the Redis call failed (the message then stays in flight until its deadline).
        """
        return await self._queue._settle(self._element, "ack")

    async def nack(self, delay: float = 0.0) -> bool:
        """Give the message back: visible again after ``delay`` seconds (a redelivery: it counts).
        ``False`` as for :meth:`ack`.

        Raises:
            InvalidDelayError: a negative, NaN or infinite delay.
            BackendError: the Redis call failed.
        """
        from ._queue import delay_to_ms

        return await self._queue._settle(self._element, str(delay_to_ms(delay)))


def parse_message(element: bytes) -> tuple[str, int, int | None, bytes]:
    """Split a message element into (id hex, delivery count, due ms or None, payload)."""
    if element[:4] != _MAGIC:
        raise ValueError("not a message element")
    count, due = _HEADER.unpack_from(element, 20)
    return element[4:20].hex(), count, (int(due) if due else None), element[32:]


class MessageIterator(Generic[T]):
    """``async for msg in queue.messages(visibility_timeout)``: receives until the queue is closed."""

    def __init__(self, queue: DelayedQueue[T], visibility_timeout: float) -> None:
        self._queue = queue
        self._visibility_timeout = visibility_timeout

    def __aiter__(self) -> MessageIterator[T]:
        return self

    async def __anext__(self) -> Message[T]:
        from .exceptions import QueueClosedError

        try:
            message = await self._queue.receive(self._visibility_timeout)
        except QueueClosedError:
            raise StopAsyncIteration from None
        assert message is not None  # no timeout: receive waits
        return message
