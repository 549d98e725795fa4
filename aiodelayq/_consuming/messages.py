"""A delivery of the reliable consumer (:class:`Message`) and how it is settled."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Generic, TypeVar

from .._wire.delays import delay_to_ms, visibility_ms
from .._wire.elements import message_id
from ..exceptions import InvalidDelayError
from .lease import Lease
from .settler import Settle, Settler

__all__ = ["Message"]

T = TypeVar("T")


@dataclass(eq=False, repr=False)
class Message(Generic[T]):
    """One delivery of a queue item, in flight until :meth:`ack` or :meth:`nack`.

    Attributes:
        value: the decoded item.
        delivery_count: 1 for the first delivery, then +1 per redelivery.
        due_ms: when this delivery became due (server epoch ms); ``None`` for a first delivery.
        deadline_ms: the end of this delivery's visibility timeout (server epoch ms).
        expires_at_ms: when it expires (server epoch ms; ``None``: never); a delivery due then goes
            to the dead-letter list instead (reason ``"expired"``).
        group: the group it was offered in (``None``: none); see :meth:`DelayedQueue.offer`.
    """

    value: T
    delivery_count: int
    due_ms: int | None
    deadline_ms: int
    _settler: Settler
    _element: bytes
    # deadline_ms on the loop clock, counted from the send so never later than the true one.
    _expires: float = 0.0
    _vt_ms: int = 0  # the visibility timeout it was received with
    # Not set by __init__: the class's defaults stand until a message differs (nothing per message).
    _settled: bool = field(default=False, init=False)
    _headers: dict[str, str] | None = field(default=None, init=False)  # None: none (no dict per message)
    expires_at_ms: int | None = field(default=None, init=False)
    group: str | None = field(default=None, init=False)

    def __repr__(self) -> str:
        return (f"Message(value={self.value!r}, id={self.id!r}, delivery_count={self.delivery_count}, "
                f"due_ms={self.due_ms}, deadline_ms={self.deadline_ms}, expires_at_ms={self.expires_at_ms}"
                + ("" if self.group is None else f", group={self.group!r}") + ")")

    @property
    def id(self) -> str:
        """The message id (hex), stable across redeliveries."""
        return message_id(self._element)

    @property
    def headers(self) -> dict[str, str]:
        """The headers it was offered with (``{}`` when none)."""
        return {} if self._headers is None else self._headers

    @property
    def settled(self) -> bool:
        """Whether this process acked, nacked or released this delivery."""
        return self._settled

    @property
    def remaining_s(self) -> float:
        """Seconds left of the visibility timeout (a lower bound; negative once passed)."""
        return self._expires - asyncio.get_running_loop().time()

    async def ack(self, *, confirm: bool | None = None) -> bool:
        """Done: remove the message for good. ``False`` if it was no longer in flight as this
        delivery (already settled, or its visibility timeout ended and it was delivered again).

        ``confirm=None`` follows the queue: written behind unless it has durable writes
        (``min_replicas``/``wait_aof``); ``True`` always waits; ``False`` writes behind anyway.

        Written behind (only with more than ``call_timeout_s`` left before the deadline and the
        queue open): ``True`` at once; a failed write is logged (WARNING), counted in
        ``stats.unconfirmed_settles``, and the message is delivered again: never a loss.
        Confirmed: returns once Redis (and, when durable, the replicas) has the ack.

        Raises:
            NotReplicatedError: (confirmed, durable queue) the ack ran on the primary but was not
                confirmed within ``replication_timeout_s`` (``maybe_applied`` is ``True``): the message
                is not delivered again unless a failover loses the ack. Acking again does not tell
                (the delivery is gone from the primary: ``False``, or this error again).
            BackendError: (confirmed) the call failed within ``call_timeout_s``: the message stays in
                flight until its deadline; ``maybe_applied`` tells whether the ack may have landed.
        """
        if self._settled:
            return False
        if self._ack_behind(confirm):
            return True
        return await self._settle(Settle(self._element, "ack", self.deadline_ms))

    def _ack_behind(self, confirm: bool | None = None) -> bool:
        """:meth:`ack`'s no-wait path without a coroutine: ``True`` if written behind, else call :meth:`ack`."""
        settler = self._settler
        if (settler.acks_confirmed if confirm is None else confirm) or self._settled:
            return False
        if settler.ack_behind(self._element, self.deadline_ms, self._expires):
            self._settled = True
            return True
        return False

    async def nack(self, delay: float = 0.0, *, dead_letter: bool = False) -> bool:
        """Give the message back: visible again after ``delay`` seconds (a counted redelivery); past
        ``max_deliveries`` it is dead-lettered (``"max_deliveries"``). ``dead_letter=True``: dead-letter
        now (``"nacked"``; ``delay`` ignored). ``False`` as for :meth:`ack`. Always confirmed.

        Raises:
            InvalidDelayError: a negative, NaN or infinite delay.
            NotReplicatedError, BackendError: as a confirmed :meth:`ack`.
        """
        delay_ms = delay_to_ms(delay)
        if self._settled:
            return False
        if dead_letter:
            return await self._settle(Settle(self._element, "dead", self.deadline_ms))
        return await self._settle(Settle(self._element, "nack", self.deadline_ms, delay_ms))

    async def release(self) -> bool:
        """Hand the message back as if never delivered: visible at once, ``delivery_count`` not raised.
        For messages never worked on (else nack). ``False`` as for :meth:`ack`. Always confirmed.

        Raises:
            NotReplicatedError, BackendError: as a confirmed :meth:`ack`.
        """
        if self._settled:
            return False
        return await self._settle(Settle(self._element, "release", self.deadline_ms))

    async def extend(self, visibility_timeout: float | timedelta) -> bool:
        """Set the visibility deadline to now + ``visibility_timeout`` (seconds; may make it sooner).
        ``False`` if this delivery no longer holds the message.

        Raises:
            InvalidDelayError: a bad timeout (at least 1 ms).
            BackendError: the call failed within ``call_timeout_s`` (the deadline may have moved).
        """
        vt_ms = visibility_ms(visibility_timeout)
        if self._settled:
            return False
        sent = asyncio.get_running_loop().time()
        deadline = await self._settler.extend(self._element, vt_ms)
        if deadline is None:
            return False
        self.deadline_ms = deadline
        self._expires = sent + vt_ms / 1000  # counted from the send: never later than the true one
        return True

    def lease(self, visibility_timeout: float | timedelta | None = None, *, every: float | None = None) -> Lease:
        """``async with msg.lease():`` extends by ``visibility_timeout`` (default: as received) every
        ``every`` seconds (default: a third of it) until the block exits; see
        :class:`~aiodelayq._consuming.lease.Lease` (``lost``).

        Raises:
            InvalidDelayError: a bad timeout or interval.
        """
        vt_ms = self._vt_ms if visibility_timeout is None else visibility_ms(visibility_timeout)
        every_s = vt_ms / 3000 if every is None else delay_to_ms(every) / 1000
        if every_s <= 0 or every_s * 1000 >= vt_ms:
            raise InvalidDelayError(f"lease interval must be > 0 and shorter than the visibility timeout ({vt_ms} ms)")
        return Lease(self.extend, visibility_timeout_s=vt_ms / 1000, every_s=every_s, label=f"message {self.id}")

    async def _settle(self, settle: Settle) -> bool:
        result = await self._settler.confirmed(settle)
        if result:
            self._settled = True
        return bool(result)
